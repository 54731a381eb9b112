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
  expect(df.from).toBe("127.0.0.1:5000/base/img:v1");
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

test("ENV and ARG as Docker reads them: legacy `ENV K value with = signs`, every word of KEY=VALUE form checked, quotes", () => {
  const envs = (text: string) => parseDockerfile(`FROM a\n${text}`, hash).steps.filter((s) => s.type === "ENV").map((s) => s.args);
  expect(envs("ENV JAVA_OPTS -Dfoo=bar -Xmx1g")).toEqual([["JAVA_OPTS", "-Dfoo=bar -Xmx1g"]]);
  expect(envs('ENV A=1 B="two words" C=\'x y\' D=a\\ b E=')).toEqual([["A", "1", "B", "two words", "C", "x y", "D", "a b", "E", ""]]);
  expect(envs("ARG V=3\nARG NODEFAULT")).toEqual([["V", "3"]]);
  expect(() => parseDockerfile("FROM a\nENV A=1 junk", hash)).toThrow('line 2: ENV "junk" is not KEY=VALUE');
  expect(() => parseDockerfile('FROM a\nENV A="open', hash)).toThrow("line 2: ENV needs a value");
  expect(() => parseDockerfile("FROM a\nENV LONELY", hash)).toThrow("line 2: ENV needs a value");
  expect(() => parseDockerfile("FROM a\nARG A B", hash)).toThrow("line 2: ARG A takes no value without '='");
});

test("BuildKit RUN flags and here-documents are refused naming the line; shifts and here-strings are plain shell", () => {
  expect(() => parseDockerfile("FROM a\nRUN --mount=type=cache,target=/root/.cache pip install x", hash)).toThrow("line 2: RUN flag --mount=type=cache,target=/root/.cache is not supported");
  expect(() => parseDockerfile("FROM a\nRUN --network=none true", hash)).toThrow("RUN flag --network=none is not supported");
  expect(() => parseDockerfile("FROM a\nRUN <<EOF\necho hi\nEOF", hash)).toThrow("line 2: RUN with a here-document (<<) is not supported");
  expect(() => parseDockerfile('FROM a\nRUN cat <<-"END" > /f', hash)).toThrow("here-document");
  expect(() => parseDockerfile("FROM a\nCOPY <<EOF /f", hash)).toThrow("line 2: COPY with a here-document (<<) is not supported");
  const ok = parseDockerfile('FROM a\nRUN echo $((1<<2)) && cat <<< "x"', hash).steps.find((s) => s.type === "RUN")!;
  expect(ok.args).toEqual(['echo $((1<<2)) && cat <<< "x"']);
});
