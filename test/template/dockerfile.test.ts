/** Dockerfile → build steps, as the E2B SDK maps them, plus unsupported instructions kept as steps. */
import { expect, test } from "bun:test";
import { parseDockerfile } from "../../src/template/dockerfile.ts";

const hash = (src: string, dest: string) => `${src}->${dest}`;

test("FROM/RUN/COPY/ENV/ARG/WORKDIR/USER/CMD with continuations, exec forms and flags", () => {
  const df = parseDockerfile(
    [
      "# comment",
      "ARG VERSION=1",
      "FROM 127.0.0.1:5000/base/img:v1 AS build",
      "RUN apt-get update && \\",
      "    apt-get install -y curl",
      'RUN ["echo", "a b"]',
      "COPY --chown=app:app --chmod=0755 src/ other.txt /opt/app/",
      "ENV A=1 B=\"two words\"",
      "ENV C three words",
      "ARG NODEFAULT",
      "WORKDIR /opt/app",
      "USER app:app",
      "EXPOSE 8080",
      'CMD ["python3", "-m", "http.server", "8080"]',
    ].join("\n"),
    hash,
  );
  expect(df.fromImage).toBe("127.0.0.1:5000/base/img:v1");
  expect(df.steps.map((s) => [s.type, s.args, s.filesHash])).toEqual([
    ["USER", ["root"], undefined],
    ["WORKDIR", ["/"], undefined],
    ["RUN", ["apt-get update &&      apt-get install -y curl"], undefined],
    ["RUN", ["echo 'a b'"], undefined],
    ["COPY", ["src/", "/opt/app/", "app", "0755"], "src/->/opt/app/"],
    ["COPY", ["other.txt", "/opt/app/", "app", "0755"], "other.txt->/opt/app/"],
    ["ENV", ["A", "1", "B", "two words"], undefined],
    ["ENV", ["C", "three words"], undefined],
    ["WORKDIR", ["/opt/app"], undefined],
    ["USER", ["app"], undefined],
    ["EXPOSE", ["8080"], undefined],
  ]);
  expect(df.startCmd).toBe("python3 -m http.server 8080");
  expect(df.readyCmd).toBe("sleep 20");
});

test("USER user and WORKDIR /home/user are appended when the file sets neither; unknown instructions stay steps", () => {
  const df = parseDockerfile("FROM debian\nHEALTHCHECK CMD true\nRUN true", hash);
  expect(df.steps.map((s) => s.type)).toEqual(["USER", "WORKDIR", "HEALTHCHECK", "RUN", "USER", "WORKDIR"]);
  expect(df.steps.at(-2)!.args).toEqual(["user"]);
  expect(df.steps.at(-1)!.args).toEqual(["/home/user"]);
  expect(df.startCmd).toBe("");
  expect(df.readyCmd).toBe("");
});

test("bad Dockerfiles name the line", () => {
  expect(() => parseDockerfile("RUN true", hash)).toThrow("line 1: RUN before FROM");
  expect(() => parseDockerfile("FROM a\nFROM b", hash)).toThrow("line 2: a second FROM");
  expect(() => parseDockerfile("FROM a\nCOPY onlyone", hash)).toThrow("line 2: COPY needs a source and a destination");
  expect(() => parseDockerfile("FROM a\nCOPY --from=x a b", hash)).toThrow("COPY flag --from=x is not supported");
  expect(() => parseDockerfile("# nothing", hash)).toThrow("no FROM");
});
