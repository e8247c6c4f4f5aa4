#!/usr/bin/env bash
# Profiles the filter's per-request path under V8 with function names, which Envoy's
# stripped binary cannot give: builds the filter's tests for wasm32 (release), runs the
# ignored test `native_request_path` (parse, route, answer, release; a fake host; the
# installed SmolLM2 tokenizer, read from data/; 2k-token completion prompts) under node's WASI with
# --cpu-prof, and prints the heaviest functions by self and inclusive time.
#   scripts/profile-filter.sh            prompts unique by a leading counter
#   SAME=1 scripts/profile-filter.sh     the same prompt every time
#   ROUNDS=60000 scripts/profile-filter.sh
#   RANDOM_TOKENS=32 scripts/profile-filter.sh   inference-perf's prompts: random token ids
#                                                decoded to text, 32 shared prefixes
# Needs node ≥ 20 (not installed by setup: a developer's tool, not part of the tests).
# The µs per request it prints is V8 running the filter's own code; in Envoy each request
# also pays the host calls and the proxy-wasm crossings.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v node >/dev/null || { echo "node not found: install Node.js ≥ 20" >&2; exit 1; }
cargo test --release -q -p prefix-router-filter --target wasm32-wasip1 --no-run
wasm=$(ls -t target/wasm32-wasip1/release/deps/prefix_router_filter-*.wasm | head -1)
out=$(mktemp -d)
cat >"$out/run.cjs" <<'EOF'
// Runs one libtest binary built for wasm32-wasip1; the proxy-wasm imports are stubs (the
// test drives the filter through its fake host and never calls them).
const { WASI } = require('node:wasi');
const fs = require('fs');
const wasi = new WASI({
  version: 'preview1',
  args: ['test', 'native_request_path', '--ignored', '--nocapture', '--test-threads=1'],
  env: { ...process.env },
  // RANDOM_TOKENS reads the installed tokenizer.json (to decode random ids) from the checkout
  preopens: { [process.env.REPO]: process.env.REPO },
});
const mod = new WebAssembly.Module(fs.readFileSync(process.argv[2]));
const imports = wasi.getImportObject();
for (const imp of WebAssembly.Module.imports(mod)) {
  imports[imp.module] ??= {};
  imports[imp.module][imp.name] ??= () => 0;
}
const inst = new WebAssembly.Instance(mod, imports);
// the SDK's reactor entry is not WASI's: start the test runner as a command
const entry = Object.fromEntries(Object.entries(inst.exports).filter(([k]) => k !== '_initialize'));
wasi.start({ exports: entry });
EOF
cat >"$out/top.cjs" <<'EOF'
// Self and inclusive share of the samples per function name in a .cpuprofile.
const fs = require('fs');
const dir = process.argv[2];
const p = JSON.parse(fs.readFileSync(dir + '/' + fs.readdirSync(dir).find(f => f.endsWith('.cpuprofile'))));
const nodes = new Map(p.nodes.map(n => [n.id, n]));
const parent = new Map();
for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
const name = id => nodes.get(id).callFrame.functionName || '(anonymous)';
const self = new Map(), incl = new Map();
for (const s of p.samples) {
  self.set(name(s), (self.get(name(s)) ?? 0) + 1);
  const seen = new Set();
  for (let id = s; id !== undefined; id = parent.get(id)) {
    if (!seen.has(name(id))) { seen.add(name(id)); incl.set(name(id), (incl.get(name(id)) ?? 0) + 1); }
  }
}
for (const [label, m] of [['self', self], ['inclusive', incl]]) {
  console.log(`== ${label} (% of ${p.samples.length} samples)`);
  [...m].sort((a, b) => b[1] - a[1]).slice(0, 30)
    .forEach(([k, v]) => console.log(`${(100 * v / p.samples.length).toFixed(1).padStart(6)}  ${k.slice(0, 120)}`));
}
EOF
REPO=$PWD ROUNDS=${ROUNDS:-40000} node --no-warnings --cpu-prof --cpu-prof-interval 200 --cpu-prof-dir="$out" "$out/run.cjs" "$wasm" 2>&1 | grep -E "µs|panicked|Error|error" || true
node "$out/top.cjs" "$out"
rm -rf "$out"
