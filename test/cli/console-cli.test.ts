/**
 * The CLI's snapshot, fork, logs, metrics and completion commands against a real node whose
 * sandboxes are loopback guests (no VM): their tables and `--json`, `logs --follow` printing a
 * line written after it started and stopping when the sandbox is gone, refusals, and the bash
 * and zsh completion scripts run by real bash and zsh. `sandbox connect` needs a guest with
 * envd: test/console/console-vm.test.ts.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { join } from "node:path";
import { createLoopback, startNodeNoVm, type TestNode } from "../api/helpers.ts";
import { waitFor } from "../helpers/wait.ts";

const MAIN = join(import.meta.dir, "../../src/cli/main.ts");
let node: TestNode;

beforeAll(async () => {
  node = await startNodeNoVm({}, undefined, {});
}, 60_000);
afterAll(async () => {
  await node?.dispose();
}, 60_000);

/** Environment of a CLI run against `node` (nothing inherited that points elsewhere). */
function env(): Record<string, string> {
  const inherited = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(E2B_|AENV_API_(URL|KEY)$)/.test(k))) as Record<string, string>;
  return { ...inherited, AENV_LOG_LEVEL: "error", AENV_HOME_PATH: node.home, AENV_API_URL: node.url };
}

async function cli(args: string[]): Promise<{ out: string; err: string; code: number }> {
  const p = Bun.spawn([process.execPath, MAIN, ...args], { stdout: "pipe", stderr: "pipe", env: env() });
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  return { out, err, code };
}

test("sandbox snapshot, sandbox fork, snapshot list and rm: ids, tables, --json, refusals", async () => {
  const s = await createLoopback(node);
  const snap = await cli(["sandbox", "snapshot", s.id, "--name", "before-upgrade"]);
  expect(snap.code).toBe(0);
  const snapId = snap.out.trim();
  expect(snapId).toMatch(/^[a-z0-9]{20}$/);
  expect(snap.err).toMatch(new RegExp(`^snapshot of ${s.id} named before-upgrade committed in \\d+ ms\\n$`));
  const asJson = JSON.parse((await cli(["sandbox", "snapshot", s.id, "--json"])).out);
  expect(asJson).toEqual({ snapshotID: expect.stringMatching(/^[a-z0-9]{20}$/), names: [] });

  const list = await cli(["snapshot", "list"]);
  expect(list.code).toBe(0);
  const lines = list.out.trimEnd().split("\n");
  expect(lines[0]).toMatch(/^SNAPSHOT ID\s+NAMES\s+SANDBOX\s+TEMPLATE\s+CREATED$/);
  expect(lines[1]).toMatch(new RegExp(`^${snapId}\\s+before-upgrade\\s+${s.id}\\s+base\\s+\\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\d$`));
  expect(lines.length).toBe(3);
  const j = JSON.parse((await cli(["snapshot", "list", "--json", "--name", "before-upgrade"])).out);
  expect(j).toEqual([{ snapshotID: snapId, names: ["before-upgrade"], sandboxID: s.id, templateID: "base", createdAt: expect.any(String) }]);

  const fork = await cli(["sandbox", "fork", s.id, "--count", "2"]);
  expect(fork.code).toBe(0);
  const children = fork.out.trim().split("\n");
  expect(children.length).toBe(2);
  for (const c of children) expect(node.orch.get(c).state).toBe("running");
  // children live as long as a created sandbox (not the API's 15 s fork default), unless --timeout says
  const life = (id: string) => (node.orch.get(id).endAt - node.orch.get(id).startedAt) / 1000;
  expect(children.map(life)).toEqual([300, 300]);
  const short = (await cli(["sandbox", "fork", s.id, "--timeout", "40"])).out.trim();
  expect(life(short)).toBe(40);
  expect((await cli(["sandbox", "fork", s.id, "--timeout", "soon"])).err).toBe("error: --timeout must be a whole number of seconds, got soon\n");
  expect((await cli(["sandbox", "fork", "--help"])).out).toContain("lifetime of each child, seconds (default 300, as `sandbox create`; the API's own fork default is 15)");
  await node.orch.kill(short);
  const forkJson = JSON.parse((await cli(["sandbox", "fork", s.id, "--json"])).out);
  expect(forkJson).toEqual([{ sandbox: expect.objectContaining({ sandboxID: expect.any(String), templateID: expect.any(String) }) }]);

  expect(await cli(["snapshot", "rm", "before-upgrade"])).toMatchObject({ code: 0, out: `deleted ${snapId}\n` });
  expect(node.orch.listSnapshots({ name: "before-upgrade" }).items).toEqual([]);
  const gone = await cli(["snapshot", "rm", "before-upgrade"]);
  expect(gone).toMatchObject({ code: 1, err: "error: no snapshot before-upgrade\n" });
  // a template is not a snapshot: rm refuses it rather than deleting the template
  expect((await cli(["snapshot", "rm", "base"])).code).toBe(1);
  expect((await cli(["sandbox", "fork", s.id, "--count", "0"])).err).toContain("--count must be 1..100, got 0");
  expect((await cli(["sandbox", "snapshot", "nosuch"])).err).toContain("404");
  for (const c of [...children, forkJson[0].sandbox.sandboxID, s.id]) await node.orch.kill(c);
}, 60_000);

test("snapshot rm of a name two snapshots carry deletes the newest and says which; an id deletes that one", async () => {
  const s = await createLoopback(node);
  const older = (await cli(["sandbox", "snapshot", s.id, "--name", "twice"])).out.trim();
  const newer = (await cli(["sandbox", "snapshot", s.id, "--name", "twice"])).out.trim();
  expect(older).not.toBe(newer);
  const ids = async () => node.orch.listSnapshots({ name: "twice" }).items.map((x) => x.snapshotID);
  expect(await ids()).toEqual([older, newer]);
  expect(await cli(["snapshot", "rm", "twice"])).toMatchObject({ code: 0, out: `deleted ${newer}\n` });
  expect(await ids()).toEqual([older]);
  const third = (await cli(["sandbox", "snapshot", s.id, "--name", "twice"])).out.trim();
  expect(await cli(["snapshot", "rm", older])).toMatchObject({ code: 0, out: `deleted ${older}\n` });
  expect(await ids()).toEqual([third]);
  expect(await cli(["snapshot", "rm", "twice"])).toMatchObject({ code: 0, out: `deleted ${third}\n` });
  expect(await ids()).toEqual([]);
  await node.orch.kill(s.id);
}, 60_000);

test("sandbox logs: table and --json; --follow prints a line written after it started and ends when the sandbox is gone", async () => {
  const s = await createLoopback(node);
  const once = await cli(["sandbox", "logs", s.id]);
  expect(once.code).toBe(0);
  expect(once.out).toMatch(/^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\s+info\s+lifecycle\s+sandbox created/m);
  const j = JSON.parse((await cli(["sandbox", "logs", s.id, "--json"])).out) as { message: string; fields: { source: string } }[];
  expect(j.some((e) => e.message.startsWith("sandbox created") && e.fields.source === "lifecycle")).toBe(true);

  const p = Bun.spawn([process.execPath, MAIN, "sandbox", "logs", s.id, "--follow", "--interval", "100"], { stdout: "pipe", stderr: "pipe", env: env() });
  let out = "";
  const reading = (async () => {
    for await (const c of p.stdout) out += new TextDecoder().decode(c);
  })();
  const waitOut = (re: RegExp) =>
    waitFor(`${re} in the output`, () => {
      if (p.exitCode !== null) throw new Error(`the CLI exited (${p.exitCode}): ${out}`);
      return re.test(out);
    }, { timeoutMs: 30_000 });
  await waitOut(/sandbox created/);
  expect(out).not.toMatch(/sandbox paused/);
  await node.orch.pause(s.id);
  await waitOut(/lifecycle\s+sandbox paused/);
  // each line once: the follower's cursor does not repeat what it printed
  expect(out.match(/sandbox created/g)!.length).toBe(1);
  await node.orch.kill(s.id);
  const code = await p.exited;
  await reading;
  expect(code).toBe(0);
  expect(await new Response(p.stderr).text()).toContain(`sandbox ${s.id} is gone`);
  expect((await cli(["sandbox", "logs", "nosuch"])).err).toContain("sandbox nosuch not found");
  expect((await cli(["sandbox", "logs", s.id, "--follow", "--interval", "5"])).err).toContain("--interval must be 50..3600000 ms, got 5");
}, 60_000);

test("sandbox metrics: no samples yet on a guest nothing sampled; --json is a list", async () => {
  const s = await createLoopback(node);
  expect(await cli(["sandbox", "metrics", s.id])).toMatchObject({ code: 0, out: "no samples yet\n" });
  expect(JSON.parse((await cli(["sandbox", "metrics", s.id, "--json"])).out)).toEqual([]);
  expect((await cli(["sandbox", "metrics", "nosuch"])).code).toBe(1);
  await node.orch.kill(s.id);
});

/** What the bash completion offers for the words typed so far (the last one being completed). */
async function bashComplete(script: string, words: string[]): Promise<string[]> {
  const line = `source ${script}; COMP_WORDS=(${words.map((w) => `'${w}'`).join(" ")}); COMP_CWORD=${words.length - 1}; _agentenv; printf '%s\\n' "\${COMPREPLY[@]}"`;
  const p = Bun.spawn(["bash", "-c", line], { stdout: "pipe", stderr: "pipe" });
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  if (code !== 0) throw new Error(`bash: ${err}`);
  return out.split("\n").filter(Boolean).sort();
}

/** The same for zsh, with compsys's _describe replaced by a printer of the offered items. */
async function zshComplete(script: string, words: string[]): Promise<string[]> {
  const line = `compdef() { :; }; _describe() { local a=\${@[-1]}; print -rl -- \${(P)a}; }; _files() { :; }; source ${script}; words=(${words.map((w) => `'${w}'`).join(" ")}); CURRENT=${words.length}; _agentenv`;
  const p = Bun.spawn(["zsh", "-f", "-c", line], { stdout: "pipe", stderr: "pipe" });
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  if (code !== 0) throw new Error(`zsh: ${err}`);
  return out.split("\n").filter(Boolean).sort();
}

test("completion: bash and zsh scripts complete commands, subcommands and flags", async () => {
  const dir = node.home;
  for (const shell of ["bash", "zsh"]) {
    const r = await cli(["completion", shell]);
    expect(r.code).toBe(0);
    await Bun.write(join(dir, `agentenv.${shell}`), r.out);
  }
  const bash = join(dir, "agentenv.bash");
  expect(await bashComplete(bash, ["agentenv", "sa"])).toEqual(["sandbox"]);
  expect(await bashComplete(bash, ["agentenv", "sandbox", "co"])).toEqual(["connect"]);
  expect(await bashComplete(bash, ["agentenv", "sandbox", "logs", "abc", "--f"])).toEqual(["--follow"]);
  expect(await bashComplete(bash, ["agentenv", "--url", "x", "snapshot", ""])).toEqual(["--help", "list", "rm"]);
  const zsh = join(dir, "agentenv.zsh");
  const z = await zshComplete(zsh, ["agentenv", "sandbox", ""]);
  expect(z).toContain("connect:an interactive terminal in a sandbox; exits with the shell's exit code");
  expect(z).toContain("logs:print a sandbox's log (lifecycle, guest console, envd); --follow for new lines");
  expect(await zshComplete(zsh, ["agentenv", "sandbox", "metrics", "--"])).toContain("--follow:keep printing new entries until the sandbox is gone");
  expect((await cli(["completion", "fish"])).err).toContain('unknown shell "fish": expected bash or zsh');
}, 60_000);
