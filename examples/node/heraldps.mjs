// A small Node.js client of a heraldps parameter-server cluster.
//
// It loads proto/heraldps/v1/ps.proto at run time (no generated code) and
// implements what every heraldps client must do itself (see ps.proto):
//   - route each key to its shard: jump_consistent_hash(splitmix64(key), S),
//     exactly as heraldps/sharding.py does, with BigInt for the 64-bit math;
//   - pack keys as little-endian int64 and rows as little-endian float32,
//     row-major [n, width], into the `bytes` fields;
//   - send every shard its part at once and put the answers back in the
//     caller's key order;
//   - commit an iteration on every shard.

import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

const here = dirname(fileURLToPath(import.meta.url));
/** The repository's proto/ directory: the only source of truth for the wire. */
export const PROTO_ROOT = resolve(here, "..", "..", "proto");

const MASK64 = (1n << 64n) - 1n;

/** The SplitMix64 finaliser (heraldps/sharding.py), on unsigned 64-bit BigInts. */
export function splitmix64(x) {
  let z = (x + 0x9e3779b97f4a7c15n) & MASK64;
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK64;
  return z ^ (z >> 31n);
}

/** Shard of one int64 key (a BigInt, may be negative) among `numShards`. */
export function shardOf(key, numShards) {
  if (numShards === 1) return 0;
  let h = splitmix64(BigInt.asUintN(64, key));
  let b = -1;
  let j = 0;
  while (j < numShards) {
    b = j;
    h = (h * 2862933555777941757n + 1n) & MASK64;
    // Double arithmetic, as in the Python (numba) version: both sides round alike.
    j = Math.floor((b + 1) * (2147483648 / Number((h >> 33n) + 1n)));
  }
  return b;
}

/** Keys (BigInts) as little-endian int64 bytes. */
export function encodeKeys(keys) {
  const out = Buffer.alloc(8 * keys.length);
  keys.forEach((k, i) => out.writeBigInt64LE(BigInt.asIntN(64, k), 8 * i));
  return out;
}

/** Little-endian int64 bytes as BigInts. */
export function decodeInt64(bytes) {
  if (bytes.length % 8) throw new Error(`int64 field of ${bytes.length} bytes`);
  const out = [];
  for (let i = 0; i < bytes.length; i += 8) out.push(bytes.readBigInt64LE(i));
  return out;
}

/** Rows (arrays of numbers, each `width` long) as little-endian float32 bytes. */
export function encodeRows(rows, width) {
  const out = Buffer.alloc(4 * width * rows.length);
  rows.forEach((row, i) => {
    if (row.length !== width) throw new Error(`row ${i} has ${row.length} floats, want ${width}`);
    row.forEach((x, j) => out.writeFloatLE(x, 4 * (i * width + j)));
  });
  return out;
}

/** Little-endian float32 bytes as `n` rows of `width` numbers. */
export function decodeRows(bytes, n, width) {
  if (bytes.length !== 4 * n * width) {
    const want = 4 * n * width;
    throw new Error(`expected ${n} x ${width} float32 (${want} bytes), got ${bytes.length}`);
  }
  const rows = [];
  for (let i = 0; i < n; i++) {
    const row = new Array(width);
    for (let j = 0; j < width; j++) row[j] = bytes.readFloatLE(4 * (i * width + j));
    rows.push(row);
  }
  return rows;
}

/** The ParameterServer service constructor, loaded from the .proto files. */
export function loadService() {
  const definition = protoLoader.loadSync("heraldps/v1/ps.proto", {
    includeDirs: [PROTO_ROOT],
    keepCase: true, // field names as in the .proto (with_state, state_width)
    longs: String, // int64 fields as decimal strings: no precision lost
    enums: String,
    defaults: true,
    oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).heraldps.v1.ParameterServer;
}

function call(stub, method, request, timeoutSeconds) {
  const deadline = new Date(Date.now() + 1000 * timeoutSeconds);
  return new Promise((resolvePromise, reject) => {
    stub[method](request, { deadline }, (err, response) => {
      if (err) {
        const name = Object.keys(grpc.status).find((k) => grpc.status[k] === err.code);
        reject(new Error(`${method} on ${stub.address}: ${name}: ${err.details}`));
      } else {
        resolvePromise(response);
      }
    });
  });
}

/** One channel per shard, in shard order (the same order as every other client). */
export class PSClient {
  constructor(addresses, { maxMessageMb = 64, timeoutSeconds = 60 } = {}) {
    if (!addresses.length) throw new Error("PSClient needs shard addresses, e.g. 127.0.0.1:7001");
    const ParameterServer = loadService();
    const options = {
      "grpc.max_send_message_length": maxMessageMb * 2 ** 20,
      "grpc.max_receive_message_length": maxMessageMb * 2 ** 20,
    };
    this.timeoutSeconds = timeoutSeconds;
    this.stubs = addresses.map((address) => {
      const stub = new ParameterServer(address, grpc.credentials.createInsecure(), options);
      stub.address = address;
      return stub;
    });
  }

  get numShards() {
    return this.stubs.length;
  }

  close() {
    this.stubs.forEach((stub) => stub.close());
  }

  /** Every shard's answer to `method(request)`, in shard order. */
  allShards(method, request) {
    return Promise.all(this.stubs.map((s) => call(s, method, request, this.timeoutSeconds)));
  }

  /** For each shard, the positions in `keys` that live there. */
  route(keys) {
    const parts = this.stubs.map(() => []);
    keys.forEach((k, i) => parts[shardOf(k, this.numShards)].push(i));
    return parts;
  }

  /** Sends `build(positions)` to each shard that owns some of `keys`; answers with positions. */
  async scatter(method, keys, build) {
    const parts = this.route(keys);
    const answers = await Promise.all(
      parts.map((positions, shard) =>
        positions.length
          ? call(this.stubs[shard], method, build(positions), this.timeoutSeconds)
          : null,
      ),
    );
    return parts.map((positions, shard) => ({ positions, response: answers[shard] }));
  }

  async createTable(spec) {
    const answers = await this.allShards("CreateTable", { spec });
    return answers.some((a) => a.created);
  }

  async describeTable(table) {
    const infos = await this.allShards("DescribeTable", { table });
    const rows = infos.reduce((sum, info) => sum + Number(info.rows), 0);
    return { dim: infos[0].spec.dim, stateWidth: infos[0].state_width, rows };
  }

  /** Oldest last-committed iteration over the shards (-1 before the first commit). */
  async committedIteration() {
    const infos = await this.allShards("GetShardInfo", {});
    return Math.min(...infos.map((info) => Number(info.committed_iteration)));
  }

  /** {values, versions, state} of `keys` (BigInts), in the caller's order. */
  async pull(table, keys, { withState = false } = {}) {
    const values = new Array(keys.length);
    const versions = new Array(keys.length);
    const state = new Array(keys.length);
    const parts = await this.scatter("Pull", keys, (positions) => ({
      table,
      keys: encodeKeys(positions.map((i) => keys[i])),
      with_state: withState,
    }));
    for (const { positions, response } of parts) {
      if (!response) continue;
      const n = positions.length;
      const rows = decodeRows(response.values, n, response.dim);
      const clocks = decodeInt64(response.versions);
      const states = withState ? decodeRows(response.state, n, response.state_width) : [];
      positions.forEach((at, i) => {
        values[at] = rows[i];
        versions[at] = clocks[i];
        if (withState) state[at] = states[i];
      });
    }
    return { values, versions, state };
  }

  /** Adds `grads` (rows of `dim` numbers) to the buffer of `iteration`; duplicates are summed. */
  async pushGradients(table, keys, grads, iteration, dim) {
    const parts = await this.scatter("PushGradients", keys, (positions) => ({
      table,
      iteration: String(iteration),
      keys: encodeKeys(positions.map((i) => keys[i])),
      grads: encodeRows(
        positions.map((i) => grads[i]),
        dim,
      ),
    }));
    return parts.reduce((sum, { response }) => sum + (response ? Number(response.rows) : 0), 0);
  }

  /** Applies `iteration`'s gradients on every shard; returns the rows updated. */
  async commit(iteration) {
    const answers = await this.allShards("Commit", { iteration: String(iteration) });
    for (const answer of answers) {
      if (Number(answer.committed_iteration) !== iteration) {
        throw new Error(`a shard answered committed_iteration ${answer.committed_iteration}`);
      }
    }
    return answers.reduce((sum, a) => sum + Number(a.rows_updated), 0);
  }
}

