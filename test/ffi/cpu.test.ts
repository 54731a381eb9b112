import { expect, test } from "bun:test";
import { CpuMeter, cpuPercentBetween, readCpuSample, type CpuSample } from "../../src/ffi/cpu.ts";

test("/proc/stat parsing and the busy share between two samples", () => {
  const a = readCpuSample("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3 4\n");
  expect(a).toEqual({ busy: 200, total: 1000 });
  const b = readCpuSample("cpu  250 0 150 1400 200 0 0 0 0 0\n");
  expect(b).toEqual({ busy: 400, total: 2000 });
  expect(cpuPercentBetween(a, b)).toBe(20);
  expect(cpuPercentBetween(a, a)).toBe(0);
});

test("a CpuMeter measures between its own calls; two meters do not share a window", async () => {
  const samples: CpuSample[] = [
    { busy: 0, total: 100 },
    { busy: 50, total: 200 },
    { busy: 50, total: 300 },
  ];
  let i = 0;
  const m = new CpuMeter(() => samples[i++]!);
  expect(await m.percent(0)).toBe(50); // first call: two samples, 50 of 100 busy
  expect(await m.percent(0)).toBe(0); // then since the previous call: 0 of 100
  const other = new CpuMeter(() => ({ busy: 10, total: 20 }));
  expect(other.sinceLast()).toBe(0); // first sinceLast has no window
  expect(other.sinceLast()).toBe(0);
});

test("the host's busy jiffies grow while this process burns CPU", () => {
  // a count, not a time bound: 300 ms of work on one core adds busy jiffies (USER_HZ 100)
  // whatever else the host runs
  const before = readCpuSample();
  const end = performance.now() + 300;
  while (performance.now() < end) Math.sqrt(Math.random());
  const after = readCpuSample();
  expect(after.busy).toBeGreaterThan(before.busy);
  expect(after.total).toBeGreaterThan(before.total);
  const pct = cpuPercentBetween(before, after);
  expect(pct).toBeGreaterThan(0);
  expect(pct).toBeLessThanOrEqual(100);
});
