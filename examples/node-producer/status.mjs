// Prints what a consumer group knows of one job, as JSON, read from its job record:
//
//   REDIS_URL=redis://127.0.0.1:6379/0 node status.mjs <stream> <group> <key>

import { createClient } from "redis";
import { status } from "./streamwork.mjs";

const [stream, group, key] = process.argv.slice(2);
if (key === undefined) {
  console.error("usage: node status.mjs <stream> <group> <key>");
  process.exit(2);
}
const client = createClient({ url: process.env.REDIS_URL ?? "redis://127.0.0.1:6379/0" });
await client.connect();
try {
  console.log(JSON.stringify(await status(client, stream, group, key)));
} finally {
  await client.quit();
}
