// The open-loop driver of npm redlock, for scripts/openloop-peer.sh: the
// same method as `redlock bench --rate` (issue 42). Starts are meant at
// origin + i/R whatever the replies do; each operation (acquire, release
// at once, its own resource so that none contends) is timed from its
// intended start (latency) and from its actual send (service). One event
// loop, no bound on operations in flight: a send is late only when the
// loop itself is busy, and that lateness is in the latency.
//
//   node openloop-peer.mjs --peer-dir DIR --base-port P --n 3 --rate R \
//       [--warm-up-ms 1000] [--secs 5] [--autopipe 1] [--timeout-ms 1000]
//
// DIR holds node_modules with redlock 5 and ioredis 5. Prints one JSON
// line: {impl, rate, intended, measured, done, errors, unsent,
// achieved_per_sec, latency_us, service_us}, the histograms as p50, p90,
// p99, p999, p9999, max (µs).
import { createRequire } from "node:module";
import path from "node:path";

const a = { peerDir: "", basePort: 0, n: 3, rate: 1000, warmUpMs: 1000, secs: 5, autopipe: 1, timeoutMs: 1000, spin: 1 };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i += 2) {
  const k = argv[i].replace(/^--/, "").replace(/-(.)/g, (_, c) => c.toUpperCase());
  a[k] = k === "peerDir" ? argv[i + 1] : parseFloat(argv[i + 1]);
}
if (!a.peerDir || !a.basePort) {
  console.error("give --peer-dir DIR and --base-port P");
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(a.peerDir), "package.json"));
const Redis = require("ioredis");
const Redlock = require("redlock").default;

const clients = [];
for (let i = 0; i < a.n; i++)
  clients.push(new Redis({ host: "127.0.0.1", port: a.basePort + i, lazyConnect: true,
    enableAutoPipelining: !!a.autopipe, commandTimeout: a.timeoutMs }));
await Promise.all(clients.map((c) => c.connect()));
const redlock = new Redlock(clients, { retryCount: 0, retryDelay: 0, retryJitter: 0 });
redlock.on("error", () => {});
// Warm: one cycle, so that scripts are loaded before the clock.
try { await redlock.release(await redlock.acquire(["ol:warm"], 10000)); } catch (_) {}

const now = () => Number(process.hrtime.bigint()) / 1000; // µs
const lead = 20_000;
const origin = now() + lead;
const warmUp = a.warmUpMs * 1000;
const length = warmUp + a.secs * 1e6;
const end = origin + length;
const drainUntil = end + 1e6;
const total = Math.ceil((length / 1e6) * a.rate - 1e-9);
const latency = new Float64Array(total);
const service = new Float64Array(total);
let recorded = 0, done = 0, errors = 0, measured = 0, inWindow = 0, next = 0, inFlight = 0, unsent = 0;

async function operate(i, intended) {
  const sent = now();
  let ok = true;
  try {
    const lock = await redlock.acquire([`ol:${i}`], 10000);
    await redlock.release(lock);
  } catch (_) { ok = false; }
  const t = now();
  if (intended >= origin + warmUp) {
    measured++;
    if (t <= end) inWindow++;
    if (ok) {
      done++;
      latency[recorded] = t - intended;
      service[recorded] = t - sent;
      recorded++;
    } else errors++;
  }
  inFlight--;
}

await new Promise((resolve) => {
  function tick() {
    const t = now();
    if (t > drainUntil) { unsent = total - next; next = total; }
    while (next < total && origin + (next * 1e6) / a.rate <= t) {
      const intended = origin + (next * 1e6) / a.rate;
      inFlight++;
      operate(next, intended);
      next++;
    }
    if (next >= total) {
      const wait = () => (inFlight === 0 ? resolve() : setTimeout(wait, 5));
      return wait();
    }
    const due = origin + (next * 1e6) / a.rate - now();
    // setTimeout is late by about a millisecond: nearer starts are met
    // by turning the loop (setImmediate lets replies in between), unless
    // SPIN is 0, when the loop sleeps and the lateness counts.
    if (due > 1500 || !a.spin) setTimeout(tick, Math.max(0, Math.floor(due / 1000) - 1));
    else setImmediate(tick);
  }
  tick();
});

function percentiles(values) {
  const v = Array.from(values).sort((x, y) => x - y);
  const at = (q) => (v.length ? Math.round(v[Math.min(v.length - 1, Math.ceil(q * v.length) - 1)]) : 0);
  return { count: v.length, p50: at(0.5), p90: at(0.9), p99: at(0.99), p999: at(0.999), p9999: at(0.9999),
    max: v.length ? Math.round(v[v.length - 1]) : 0 };
}
console.log(JSON.stringify({
  impl: `node redlock${a.autopipe ? " autopipeline" : ""}`, rate: a.rate, intended: total, measured, done, errors,
  unsent, achieved_per_sec: inWindow / a.secs,
  latency_us: percentiles(latency.subarray(0, recorded)), service_us: percentiles(service.subarray(0, recorded)),
}));
for (const c of clients) c.disconnect();
