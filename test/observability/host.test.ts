import { expect, test } from "bun:test";
import { cpuPercentBetween, hostCpuPercent, readCpuSample } from "../../src/observability/host.ts";

test("/proc/stat parsing and the busy share between two samples", () => {
  const a = readCpuSample("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3 4\n");
  expect(a).toEqual({ busy: 200, total: 1000 });
  const b = readCpuSample("cpu  250 0 150 1400 200 0 0 0 0 0\n");
  expect(b).toEqual({ busy: 400, total: 2000 });
  expect(cpuPercentBetween(a, b)).toBe(20);
  expect(cpuPercentBetween(a, a)).toBe(0);
});

test("host CPU percent is measured, within 0..100, and follows real load", async () => {
  const idleish = await hostCpuPercent(50);
  expect(idleish).toBeGreaterThanOrEqual(0);
  expect(idleish).toBeLessThanOrEqual(100);
  // keep one core busy for 300 ms: the share of 2+ cores must be clearly above zero
  const end = performance.now() + 300;
  while (performance.now() < end) Math.sqrt(Math.random());
  expect(await hostCpuPercent()).toBeGreaterThan(5);
});
