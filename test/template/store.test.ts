/** Template store (manifest validation, resolve, list) and mirror discovery from apt sources. */
import { describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { hostDebianMirror, listTemplates, resolveTemplate, TemplateError, writeManifest, type TemplateManifest } from "../../src/template/index.ts";

function withDir(fn: (d: string) => void): void {
  const d = mkdtempSync(join(tmpdir(), "c1tpl-"));
  try {
    fn(d);
  } finally {
    rmSync(d, { recursive: true, force: true });
  }
}

function code(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(TemplateError);
    return (e as TemplateError).code;
  }
  return "no error";
}

const manifest = (name: string): TemplateManifest => ({
  name,
  rootfs: "rootfs.ext4",
  layers: ["rootfs.layer"],
  bootArgs: "root=/dev/vda rw init=/sbin/aenv-init",
  diskBytes: 1 << 30,
  buildKey: "k1",
  createdAt: "2026-11-29T00:00:00.000Z",
});

describe("template store", () => {
  test("resolve gives absolute paths; list skips broken entries", () =>
    withDir((home) => {
      writeManifest(home, manifest("base"));
      writeFileSync(join(home, "templates/base/rootfs.ext4"), "x");
      const r = resolveTemplate(home, "base");
      expect(r).toEqual({
        name: "base",
        dir: join(home, "templates/base"),
        rootfsPath: join(home, "templates/base/rootfs.ext4"),
        rootLayers: [join(home, "templates/base/rootfs.layer")],
        bootArgs: "root=/dev/vda rw init=/sbin/aenv-init",
        diskBytes: 1 << 30,
        buildKey: "k1",
        snapshot: null,
        cpuCount: null,
        memoryMB: null,
      });
      // a template committed as a snapshot names it, with its VM shape
      writeManifest(home, { ...manifest("base"), snapshot: "abcdefghij0123456789", cpuCount: 2, memoryMB: 1024 });
      expect(resolveTemplate(home, "base")).toMatchObject({ snapshot: "abcdefghij0123456789", cpuCount: 2, memoryMB: 1024 });
      writeManifest(home, { ...manifest("base"), snapshot: "../x" });
      expect(code(() => resolveTemplate(home, "base"))).toBe("template.bad_manifest");
      writeManifest(home, manifest("base"));
      mkdirSync(join(home, "templates/broken"));
      writeFileSync(join(home, "templates/broken/manifest.json"), "{");
      mkdirSync(join(home, "templates/.cache"));
      expect(listTemplates(home).map((m) => m.name)).toEqual(["base"]);
    }));

  test("missing, malformed and unsafe manifests are errors", () =>
    withDir((home) => {
      expect(code(() => resolveTemplate(home, "nope"))).toBe("template.not_found");
      expect(code(() => resolveTemplate(home, "../etc"))).toBe("template.bad_name");
      expect(code(() => resolveTemplate(home, "Upper"))).toBe("template.bad_name");
      writeManifest(home, manifest("t1")); // rootfs file absent
      expect(code(() => resolveTemplate(home, "t1"))).toBe("template.not_found");
      writeManifest(home, { ...manifest("t2"), rootfs: "../../etc/passwd" });
      expect(code(() => resolveTemplate(home, "t2"))).toBe("template.bad_manifest");
      writeManifest(home, { ...manifest("t3"), layers: ["/abs/layer"] });
      expect(code(() => resolveTemplate(home, "t3"))).toBe("template.bad_manifest");
      writeManifest(home, { ...manifest("t4"), diskBytes: -1 });
      expect(code(() => resolveTemplate(home, "t4"))).toBe("template.bad_manifest");
      mkdirSync(join(home, "templates/t5"), { recursive: true });
      writeFileSync(join(home, "templates/t5/manifest.json"), JSON.stringify({ ...manifest("other") }));
      expect(code(() => resolveTemplate(home, "t5"))).toBe("template.bad_manifest");
      expect(listTemplates(join(home, "absent"))).toEqual([]);
    }));
});

describe("hostDebianMirror", () => {
  test("reads deb822 and one-line sources, matching the suite and skipping disabled stanzas", () =>
    withDir((apt) => {
      mkdirSync(join(apt, "sources.list.d"));
      writeFileSync(
        join(apt, "sources.list.d/debian.sources"),
        [
          "Types: deb",
          "URIs: http://disabled.example/debian",
          "Suites: bookworm",
          "Enabled: no",
          "",
          "Types: deb-src",
          "URIs: http://src.example/debian",
          "Suites: bookworm",
          "",
          "Types: deb",
          "URIs: http://deb.debian.org/debian",
          "Suites: bookworm bookworm-updates",
          "Components: main",
          "",
        ].join("\n"),
      );
      writeFileSync(join(apt, "sources.list.d/other.list.disabled"), "deb http://nope.example/debian bookworm main\n");
      expect(hostDebianMirror("bookworm", apt)).toBe("http://deb.debian.org/debian");
      expect(code(() => hostDebianMirror("trixie", apt))).toBe("template.no_mirror");
      writeFileSync(join(apt, "sources.list"), "# c\ndeb [arch=amd64] https://mirror.example/debian trixie main\n");
      expect(hostDebianMirror("trixie", apt)).toBe("https://mirror.example/debian");
    }));
});
