// One synchronous training step from Node.js, checked against the optimizer.
//
//   npm ci && node demo.mjs --ps 127.0.0.1:7001,127.0.0.1:7002 [--json report.json]
//
// Creates two tables (SGD and AdaGrad), pulls rows, pushes gradients for the
// next iteration, commits it on every shard and pulls again. The expected rows
// are computed here in float32 (Math.fround after every operation, in the same
// order as heraldps/optim.py), so they must equal the pulled rows bit for bit.
// Exits 1 on any mismatch. --json writes what was sent and received, so a
// test can check the same rows from another client.

import { writeFileSync } from "node:fs";
import { parseArgs } from "node:util";

import { PSClient, shardOf } from "./heraldps.mjs";

const f32 = Math.fround;
const DIM = 8;

// Keys across the whole int64 range, with duplicates (their gradients are summed).
const KEYS = [
  3n, 1n << 40n, -7n, 3n, 9223372036854775807n, -9223372036854775808n, 123456789n, 42n,
  0n, 1n, 2n, 5n, 8n, 13n, 21n, 34n, -1n, 42n, 1000003n, 3n,
];

const TABLES = [
  {
    spec: {
      name: "node_sgd",
      dim: DIM,
      initializer: { normal: { mean: 0, std: 0.01 }, seed: "7" },
      optimizer: { sgd: { lr: 0.1 } },
      update_mode: "UPDATE_MODE_SYNCHRONOUS",
    },
    // values -= lr * grads
    apply(value, _state, grad) {
      const lr = f32(0.1);
      return { value: value.map((w, j) => f32(w - f32(lr * grad[j]))), state: [] };
    },
  },
  {
    spec: {
      name: "node_adagrad",
      dim: DIM,
      initializer: { uniform: { low: -0.05, high: 0.05 }, seed: "11" },
      optimizer: { adagrad: { lr: 0.05, initial_accumulator: 0.1, eps: 1e-8 } },
      update_mode: "UPDATE_MODE_SYNCHRONOUS",
    },
    // acc += g * g; values -= lr * g / (sqrt(acc) + eps)
    apply(value, state, grad) {
      const lr = f32(0.05);
      const eps = f32(1e-8);
      const acc = state.map((a, j) => f32(a + f32(grad[j] * grad[j])));
      const next = value.map((w, j) => {
        const step = f32(f32(lr * grad[j]) / f32(f32(Math.sqrt(acc[j])) + eps));
        return f32(w - step);
      });
      return { value: next, state: acc };
    },
  },
];

/** A gradient that is exact in float32, different per key position and column. */
function gradient(i, j) {
  return (((i + 1) * (j + 2)) % 7) * 0.25 - 0.75;
}

/** Float32 sum of the gradient rows of each distinct key, in push order. */
function summedGradients(keys, grads) {
  const sums = new Map();
  keys.forEach((k, i) => {
    const key = k.toString();
    const prev = sums.get(key);
    sums.set(key, prev ? prev.map((x, j) => f32(x + grads[i][j])) : grads[i].slice());
  });
  return sums;
}

function sameRow(a, b) {
  return a.length === b.length && a.every((x, j) => Object.is(x, b[j]));
}

/** Rows of `after` that differ from one optimizer step on `entry.before` (printed). */
function checkRows(table, entry, after, sums) {
  let bad = 0;
  KEYS.forEach((key, i) => {
    const want = table.apply(entry.before[i], entry.state_before[i], sums.get(key.toString()));
    const clock = BigInt(entry.versions_before[i]) + 1n;
    const got = { value: after.values[i], state: after.state[i], version: after.versions[i] };
    if (sameRow(want.value, got.value) && sameRow(want.state, got.state) && got.version === clock) {
      return;
    }
    bad += 1;
    console.error(`MISMATCH ${table.spec.name} key ${key}: want ${want.value} (version ${clock}),`);
    console.error(`  got ${got.value} (version ${got.version})`);
  });
  return bad;
}

async function main() {
  const { values: args } = parseArgs({
    options: { ps: { type: "string" }, json: { type: "string" } },
  });
  const addresses = (args.ps ?? process.env.HERALDPS_PS ?? "127.0.0.1:7001")
    .split(",")
    .filter(Boolean);
  const ps = new PSClient(addresses);
  const report = { addresses, tables: {} };
  let mismatches = 0;
  try {
    const perShard = ps.route(KEYS).map((p) => p.length);
    console.log(`connected to ${ps.numShards} shard(s); keys per shard: ${perShard.join(", ")}`);
    const iteration = (await ps.committedIteration()) + 1;
    report.iteration = iteration;
    const grads = KEYS.map((_, i) => Array.from({ length: DIM }, (_, j) => gradient(i, j)));
    const expectedSums = summedGradients(KEYS, grads);

    for (const table of TABLES) {
      const name = table.spec.name;
      const created = await ps.createTable(table.spec);
      const info = await ps.describeTable(name);
      const status = created ? "created" : "exists";
      console.log(`${name}: ${status}, dim ${info.dim}, state width ${info.stateWidth}`);
      const before = await ps.pull(name, KEYS, { withState: true });
      const rows = await ps.pushGradients(name, KEYS, grads, iteration, DIM);
      console.log(`${name}: pulled ${KEYS.length} rows, pushed ${rows} gradient rows`);
      report.tables[name] = {
        keys: KEYS.map(String),
        shards: KEYS.map((k) => shardOf(k, ps.numShards)),
        grads,
        before: before.values,
        state_before: before.state,
        versions_before: before.versions.map(String),
      };
    }

    const updated = await ps.commit(iteration);
    console.log(`committed iteration ${iteration} on ${ps.numShards} shard(s): ${updated} rows`);

    for (const table of TABLES) {
      const name = table.spec.name;
      const entry = report.tables[name];
      const after = await ps.pull(name, KEYS, { withState: true });
      entry.after = after.values;
      entry.state_after = after.state;
      entry.versions_after = after.versions.map(String);
      const bad = checkRows(table, entry, after, expectedSums);
      console.log(`${name}: ${KEYS.length - bad}/${KEYS.length} rows equal the optimizer's result`);
      mismatches += bad;
    }
    const distinctRows = expectedSums.size * TABLES.length;
    if (updated !== distinctRows) {
      mismatches += 1;
      console.error(`MISMATCH: the commit updated ${updated} rows, want ${distinctRows}`);
    }
  } finally {
    ps.close();
    if (args.json) writeFileSync(args.json, JSON.stringify(report));
  }
  if (mismatches) {
    console.error(`${mismatches} mismatch(es)`);
    process.exitCode = 1;
  } else {
    console.log("all rows as the optimizer says");
  }
}

main().catch((err) => {
  console.error(`error: ${err.message}`);
  process.exitCode = 2;
});
