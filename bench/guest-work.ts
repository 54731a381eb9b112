/**
 * Guest work shared by the benches that measure QEMU under TCG (bench/vm.ts, bench/snapshot.ts
 * through test/e2e/fixtures/snapshot-bench.ts).
 */

/** CPU-bound guest work with a large code footprint (the Python interpreter, json, re, sorting). */
export const CPU_SCRIPT = `python3 -c "
import json, re
s = 0
for i in range(20000):
    d = json.loads(json.dumps({'k': i, 'v': [i, str(i) * 3, {'x': i / 7}]}))
    s += len(re.findall(r'[0-9]+', json.dumps(d)))
print(sorted(str(j * 7919 % 10007) for j in range(20000))[9999], s)
"`;
