// A streamwork producer and job-status reader for Node.js, written from the repository's
// docs/reference/wire-format.md and docs/reference/keys.md alone (no streamwork code): it
// sends plain, keyed, delayed and priority jobs, with per-job options, and reads what
// became of a job from its job record. Any Redis client and MessagePack library will do;
// this one uses `redis` (node-redis) and `@msgpack/msgpack`.

import { randomBytes } from "node:crypto";
import { Decoder, Encoder, ExtData, ExtensionCodec } from "@msgpack/msgpack";
import { RESP_TYPES } from "redis";

// ---- key names (keys.md) -------------------------------------------------------------------

/** Bytes of `text` in UTF-8: names in keys carry their length in bytes, not characters. */
const utf8Length = (text) => Buffer.byteLength(text, "utf8");

/** The prefix of every key of stream `stream`: `{S}`, or `{tag}~<len>:S` for a name that
 * carries its own hash tag. */
export function keyPrefix(stream) {
  const tag = /\{([^{}]+)\}/.exec(stream);
  return tag === null ? `{${stream}}` : `${tag[0]}~${utf8Length(stream)}:${stream}`;
}

/** The job record of job `key` in consumer group `group` of `stream`. */
export function jobRecordKey(stream, group, key) {
  return `${keyPrefix(stream)}:job:${utf8Length(group)}:${group}:${key}`;
}

// ---- payload values (wire-format.md, "Extension types") ------------------------------------

/** A decimal number kept exact: Python workers get a `Decimal`. */
export class Decimal {
  constructor(text) {
    if (!/^(-?\d+(\.\d+)?([Ee][+-]?\d+)?|-?(NaN|sNaN|Infinity))$/.test(text)) {
      throw new TypeError(`not a decimal string: ${JSON.stringify(text)}`);
    }
    this.text = text;
  }
  toJSON() {
    return { $decimal: this.text };
  }
}

/** A UUID (Python: `uuid.UUID`), from its usual 8-4-4-4-12 hex form. */
export class Uuid {
  constructor(text) {
    const hex = text.replaceAll("-", "");
    if (!/^[0-9a-fA-F]{32}$/.test(hex)) throw new TypeError(`not a UUID: ${text}`);
    this.text = text.toLowerCase();
  }
  toJSON() {
    return { $uuid: this.text };
  }
}

/** A calendar date (Python: `datetime.date`), `YYYY-MM-DD`. */
export class CalendarDate {
  constructor(text) {
    if (!/^\d{4}-\d{2}-\d{2}$/.test(text)) throw new TypeError(`not a date: ${text}`);
    this.text = text;
  }
  toJSON() {
    return { $date: this.text };
  }
}

// ext types 1, 2 and 3; a JS Date is MessagePack's own timestamp (ext -1), which
// @msgpack/msgpack writes and reads by itself (an aware datetime in UTC for Python)
const extensions = new ExtensionCodec();
extensions.register({
  type: 1,
  encode: (v) => (v instanceof Decimal ? Buffer.from(v.text, "ascii") : null),
  decode: (data) => new Decimal(Buffer.from(data).toString("ascii")),
});
extensions.register({
  type: 2,
  encode: (v) => (v instanceof Uuid ? Buffer.from(v.text.replaceAll("-", ""), "hex") : null),
  decode: (data) => {
    const h = Buffer.from(data).toString("hex");
    return new Uuid(`${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`);
  },
});
extensions.register({
  type: 3,
  encode: (v) => (v instanceof CalendarDate ? Buffer.from(v.text, "ascii") : null),
  decode: (data) => new CalendarDate(Buffer.from(data).toString("ascii")),
});
const encoder = new Encoder({ extensionCodec: extensions });
const decoder = new Decoder({ extensionCodec: extensions });
const pack = (value) => Buffer.from(encoder.encode(value));
const unpack = (bytes) => decoder.decode(bytes);

// ---- job bodies (wire-format.md, "Stream entries" and "Job options") ----------------------

const LEVELS = ["high", "normal", "low"];

/** The job's options map `o`: only the options that are not their default. */
export function wireOptions(key, { timeout, orderKey, priority, expires } = {}) {
  const o = {};
  if (timeout !== undefined && timeout !== null) {
    if (!(timeout > 0) || !Number.isFinite(timeout)) throw new RangeError("timeout must be seconds > 0");
    o.l = Math.max(1, Math.round(timeout * 1000)); // the time limit in milliseconds
  }
  if (orderKey !== undefined && orderKey !== null && orderKey !== key) {
    if (typeof orderKey !== "string" || orderKey === "") throw new TypeError("orderKey must be a non-empty string");
    o.ok = orderKey;
  }
  if (priority !== undefined && priority !== null && priority !== "normal") {
    if (!LEVELS.includes(priority)) throw new RangeError(`priority must be one of ${LEVELS.join(", ")}`);
    o.pr = priority;
  }
  if (expires !== undefined && expires !== null) {
    // seconds from now, or a Date: carried as Unix milliseconds
    const until = expires instanceof Date ? expires.getTime() : Date.now() + Math.round(expires * 1000);
    if (until <= Date.now()) throw new RangeError("expires has passed already");
    o.ex = until;
  }
  return o;
}

/** A version 3 body: `{v, k, t, h, p}`, and `o` when the job has options. */
export function jobBody(key, payload, options = {}, headers = {}) {
  if (typeof key !== "string" || key === "") throw new TypeError("the job key must be a non-empty string");
  for (const [name, value] of Object.entries(headers)) {
    if (typeof value !== "string") throw new TypeError(`header ${name} must be a string`);
  }
  const body = { v: 3, k: key, t: Date.now(), h: headers, p: payload };
  const o = wireOptions(key, options);
  if (Object.keys(o).length > 0) body.o = o;
  return pack(body);
}

/** A body read back (for tools that show what a stream holds). */
export const decodeBody = (bytes) => unpack(bytes);

// ---- sending (wire-format.md, "Sending a job, step by step") -------------------------------

const randomKey = () => randomBytes(16).toString("hex");

/** The Redis server's clock, in Unix ms (a delay is measured on it). */
async function serverNowMs(client) {
  const [seconds, micros] = await client.sendCommand(["TIME"]);
  return Number(seconds) * 1000 + Math.floor(Number(micros) / 1000);
}

/**
 * Send one job to `stream`; returns `{ key, id }` (`id`: the entry id, null for a delayed
 * job, which gets one when it falls due).
 *
 * options: `key` (the job's identity: without it, a random key and no deduplication),
 * `priority` ("high" | "normal" | "low"), `delay` (seconds) or `at` (a Date), `timeout`
 * (seconds), `orderKey`, `expires` (seconds from now, or a Date), `headers` (string to
 * string), `maxlen` (keep about this many entries).
 */
export async function send(client, stream, payload, options = {}) {
  const { key = randomKey(), priority = "normal", delay, at, headers = {}, maxlen } = options;
  const prefix = keyPrefix(stream);
  const partitions = await client.get(`${prefix}:partitions`);
  if (partitions !== null && partitions !== "1") {
    throw new Error(`${stream} is split into ${partitions} partitions: this producer sends to ` +
      "unpartitioned streams only");
  }
  const body = jobBody(key, payload, { ...options, priority }, headers);
  if (delay !== undefined || at !== undefined) {
    if (delay !== undefined && at !== undefined) throw new Error("give delay or at, not both");
    if (priority !== "normal") throw new Error("delayed jobs are sent at the normal level only");
    const due = at !== undefined ? at.getTime() : (await serverNowMs(client)) + Math.round(delay * 1000);
    const member = Buffer.concat([Buffer.from(`0:${randomKey()}:`, "ascii"), body]);
    await client.sendCommand(["ZADD", `${prefix}:delayed`, String(due), member]);
    return { key, id: null };
  }
  const target = priority === "normal" ? stream : `${prefix}:p:${priority}`;
  const trim = maxlen === undefined ? [] : ["MAXLEN", "~", String(maxlen)];
  const id = await client.sendCommand(["XADD", target, ...trim, "*", "d", body]);
  return { key, id: String(id) };
}

// ---- job status (keys.md, "What a job record holds") ---------------------------------------

/** `text` split at `sep` into at most `limit` parts, the last one keeping the rest. */
function splitAtMost(text, sep, limit) {
  const parts = [];
  let rest = text;
  while (parts.length < limit - 1) {
    const at = rest.indexOf(sep);
    if (at < 0) break;
    parts.push(rest.slice(0, at));
    rest = rest.slice(at + sep.length);
  }
  parts.push(rest);
  return parts;
}

const seconds = (ms) => (ms === null || ms === undefined ? null : Number(ms) / 1000);

/** A status from a job record's bytes (null: no record): state, attempts, result, ... */
export function decodeRecord(raw, nowMs = Date.now()) {
  const status = { state: "unknown", attempts: 0, result: null, resultNote: "", error: "",
    reason: "", updatedAt: null, due: null, deadLetterId: null, fencingToken: null };
  if (raw === null || raw === undefined || raw.length === 0) return status;
  const kind = String.fromCharCode(raw[0]);
  const rest = raw.subarray(1);
  if (kind === "H" || kind === "R") {
    // <owner>:<token>|<attempt>|<since ms>[|W<due ms>][|C<deadline ms>|<ttl ms>|<reason>]
    const parts = splitAtMost(rest.toString("utf8"), "|", 6);
    const lease = parts[0];
    const token = lease.slice(lease.lastIndexOf(":") + 1); // the owner holds colons too
    const attempt = Number.parseInt(parts[1], 10);
    Object.assign(status, { updatedAt: seconds(parts[2]),
      fencingToken: /^\d+$/.test(token) ? Number(token) : null });
    const extra = parts[3] ?? "";
    if (kind === "H") {
      status.attempts = attempt - 1;
      if (extra.startsWith("W")) {
        return Object.assign(status, { state: "waiting", due: seconds(extra.slice(1)),
          reason: "retry in place (ordered)" });
      }
      return Object.assign(status, { state: "queued", reason: "held by a worker" });
    }
    status.attempts = attempt;
    if (extra.startsWith("C") && parts.length === 6) {
      const why = parts[5];
      if (Number(extra.slice(1)) <= nowMs) return Object.assign(status, { state: "cancelled", reason: why });
      return Object.assign(status, { state: "running",
        reason: why ? `cancel requested: ${why}` : "cancel requested" });
    }
    return Object.assign(status, { state: "running" });
  }
  const f = unpack(rest);
  switch (kind) {
    case "D": // [token, attempts, updated ms, result, note]
      return Object.assign(status, { state: "done", fencingToken: Number(f[0]) || null,
        attempts: Number(f[1]), updatedAt: seconds(f[2]), result: f[3] ?? null, resultNote: f[4] });
    case "W": // [attempts, updated ms, due ms, error]
      return Object.assign(status, { state: "waiting", attempts: Number(f[0]),
        updatedAt: seconds(f[1]), due: seconds(f[2]), error: f[3] });
    case "X": // [attempts, updated ms, dead-letter id, reason, error]
      return Object.assign(status, { state: "dead", attempts: Number(f[0]),
        updatedAt: seconds(f[1]), deadLetterId: f[2], reason: f[3], error: f[4] });
    case "C": // [updated ms, reason]
      return Object.assign(status, { state: "cancelled", updatedAt: seconds(f[0]), reason: f[1] });
    case "E": // [attempts, updated ms, state, reason]
      return Object.assign(status, { state: String(f[2]), attempts: Number(f[0]),
        updatedAt: seconds(f[1]), reason: f[3] });
    default:
      throw new Error(`job record with an unknown state byte ${JSON.stringify(kind)}`);
  }
}

/** What group `group` knows of job `key` of `stream`. */
export async function status(client, stream, group, key) {
  const raw = await client.sendCommand(["GET", jobRecordKey(stream, group, key)],
    { typeMapping: { [RESP_TYPES.BLOB_STRING]: Buffer } });
  return decodeRecord(raw);
}

const LIVE = new Set(["unknown", "queued", "running", "waiting"]); // every other state is final

/** Poll `status` until the job has finished (done, dead, cancelled, expired, ...), at most
 * `timeoutMs`; returns the last status read. */
export async function waitFinished(client, stream, group, key, timeoutMs = 30000) {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const st = await status(client, stream, group, key);
    if (!LIVE.has(st.state) || Date.now() >= until) return st;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
