/**
 * /tmp on the root disk (issue 29) with the real parts: `agentenv server` in a private netns,
 * QEMU microVMs with the guest init of the tools drive, template builds in build VMs, envd, and
 * the unmodified e2b@2.51.0 SDK (test/e2e/fixtures/tmp-root-disk.ts).
 */
import { expect, test } from "bun:test";
import { nodeForFile } from "./world.ts";

const node = nodeForFile();

test("a build step's /tmp is in the template; 1 GiB to /tmp in a 512 MiB sandbox is byte-exact; a memory pause and a filesystem-only pause's cold boot keep /tmp", async () => {
  const o = await node().client("tmp-root-disk.ts", [], 1_500_000);
  console.log(`tmp e2e: upload of 1 GiB ${o.uploadMs} ms`);
  expect(o.built).toBe("from-build\nfrom-build\n/tmp/aenv-build\next2/ext3\n");
  expect(o.tmpFs).toBe("ext2/ext3");
  expect(o.memTotalKiB).toBeLessThan(512 * 1024);
  expect(o.guest).toEqual([String(1024 ** 3), o.sentHash]);
  expect(o.afterMemoryResume).toBe("kept");
  expect(o.afterColdBoot).toBe("kept.txt\nkept\n1777\next2/ext3\n");
}, 1_600_000);
