// Sends a plain, a keyed (twice), a delayed, a high-priority and a failing job to stream
// "node-jobs", then waits until group "py" (worker.py, a Python streamwork worker) has run
// them, and prints each job's status as one JSON line: {"job": ..., "key": ..., "status": ...}.
//
//   REDIS_URL=redis://127.0.0.1:6379/0 python worker.py    # in one terminal
//   REDIS_URL=redis://127.0.0.1:6379/0 node demo.mjs       # in another

import { createClient } from "redis";
import { CalendarDate, Decimal, send, waitFinished } from "./streamwork.mjs";

const STREAM = "node-jobs";
const GROUP = "py";
const url = process.env.REDIS_URL ?? "redis://127.0.0.1:6379/0";
const run = Math.random().toString(16).slice(2, 10); // keys of their own on every run

const client = createClient({ url });
client.on("error", (err) => console.error("redis:", err.message));
await client.connect();
try {
  const sent = {
    // no key: a random one, so two such sends are two jobs
    plain: await send(client, STREAM, { kind: "plain", n: 1 }),
    // a key of your own: sent twice (a retried request, a double click), run once
    keyed: await send(client, STREAM, { kind: "keyed", amount: new Decimal("12.50"),
      day: new CalendarDate("2026-12-01"), at: new Date(Date.UTC(2026, 11, 1, 6)) },
      { key: `invoice-${run}`, timeout: 2.5, orderKey: `customer-${run}` }),
    delayed: await send(client, STREAM, { kind: "delayed" }, { key: `reminder-${run}`, delay: 1 }),
    urgent: await send(client, STREAM, { kind: "urgent" }, { key: `alert-${run}`, priority: "high",
      expires: 600 }),
    failing: await send(client, STREAM, { kind: "fail" }, { key: `broken-${run}` }),
  };
  await send(client, STREAM, { kind: "keyed", amount: new Decimal("12.50") }, { key: `invoice-${run}` });
  for (const [job, { key }] of Object.entries(sent)) {
    const st = await waitFinished(client, STREAM, GROUP, key, 60000);
    console.log(JSON.stringify({ job, key, status: st }));
  }
} finally {
  await client.quit();
}
