/**
 * `agentenv completion bash|zsh`: a shell completion script for every command, subcommand and
 * flag of the binary, generated from the command tree itself (each lazily loaded subcommand is
 * loaded once here). Install: `agentenv completion bash > /etc/bash_completion.d/agentenv`, or
 * for zsh `agentenv completion zsh > "${fpath[1]}/_agentenv"` (then `compinit`).
 * The scripts are static: completing runs no agentenv process.
 */
import { defineCommand, type ArgsDef, type CommandDef } from "citty";
import { CliError, run } from "./node-client.ts";

/** One command of the tree: its words to complete. */
export interface CommandNode {
  /** Path from the root, e.g. ["sandbox", "logs"]; [] for the root. */
  path: string[];
  description: string;
  flags: { name: string; description: string }[];
  subs: { name: string; description: string }[];
}

type Resolvable<T> = T | Promise<T> | (() => T | Promise<T>);
const resolve = async <T>(v: Resolvable<T> | undefined): Promise<T | undefined> => (typeof v === "function" ? await (v as () => T | Promise<T>)() : await v);

/** Every command under `cmd`, depth first, root first. */
export async function commandTree(cmd: CommandDef<any>, path: string[] = []): Promise<CommandNode[]> {
  const meta = (await resolve(cmd.meta)) ?? {};
  const args = ((await resolve(cmd.args)) ?? {}) as ArgsDef;
  const subs = ((await resolve(cmd.subCommands)) ?? {}) as Record<string, Resolvable<CommandDef<any>>>;
  const flags = Object.entries(args)
    .filter(([, a]) => a.type !== "positional")
    .flatMap(([name, a]) => [`--${name}`, ...[(a as { alias?: string | string[] }).alias ?? []].flat().map((x) => (x.length === 1 ? `-${x}` : `--${x}`))].map((f) => ({ name: f, description: a.description ?? "" })));
  flags.push({ name: "--help", description: "show usage" });
  const children: CommandNode[] = [];
  const subList: CommandNode["subs"] = [];
  for (const [name, sub] of Object.entries(subs)) {
    const def = (await resolve(sub))!;
    const tree = await commandTree(def, [...path, name]);
    subList.push({ name, description: tree[0]!.description });
    children.push(...tree);
  }
  return [{ path, description: meta.description ?? "", flags, subs: subList }, ...children];
}

const key = (path: string[]) => `/${path.join("/")}`;
const shQuote = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

/**
 * The part both scripts share (bash and zsh read it alike): walk the words before the cursor
 * (`word` expands to the i-th, from index `first` up to `cursor`) to the deepest command path they
 * name (`$at`, e.g. `/sandbox/logs`; flags are passed over), then run that command's line of
 * `body(node)`, which sets the words to offer.
 */
function walkToCommand(tree: CommandNode[], o: { first: number; cursor: string; word: string }, body: (n: CommandNode) => string): string {
  const paths = tree.filter((n) => n.path.length > 0).map((n) => `"${key(n.path)}"`);
  const cases = tree.map((n) => `    "${n.path.length ? key(n.path) : ""}") ${body(n)} ;;`);
  return `  for ((i = ${o.first}; i < ${o.cursor}; i++)); do
    w=${o.word}
    [[ $w == -* ]] && continue
    case "$at/$w" in
      ${paths.join("|")}) at="$at/$w" ;;
    esac
  done
  case "$at" in
${cases.join("\n")}
  esac`;
}

/** A bash completion script (complete -F) for the tree. */
export function bashScript(tree: CommandNode[]): string {
  const walk = walkToCommand(tree, { first: 1, cursor: "COMP_CWORD", word: "${COMP_WORDS[i]}" }, (n) => `words=${shQuote([...n.subs.map((s) => s.name), ...n.flags.map((f) => f.name)].join(" "))}`);
  return `# bash completion for agentenv (agentenv completion bash)
_agentenv() {
  local cur=\${COMP_WORDS[COMP_CWORD]} at="" words="" i w
${walk}
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -o default -F _agentenv agentenv
`;
}

const zshEscape = (s: string) => s.replace(/\\/g, "\\\\").replace(/'/g, `'\\''`).replace(/:/g, "\\:").replace(/\n/g, " ");

/** A zsh completion function (#compdef) for the tree, with descriptions. */
export function zshScript(tree: CommandNode[]): string {
  const described = (xs: { name: string; description: string }[]) => xs.map((x) => `'${zshEscape(x.name)}:${zshEscape(x.description)}'`).join(" ");
  const walk = walkToCommand(tree, { first: 2, cursor: "CURRENT", word: "${words[i]}" }, (n) => `subs=(${described(n.subs)}); flags=(${described(n.flags)})`);
  return `#compdef agentenv
# zsh completion for agentenv (agentenv completion zsh)
_agentenv() {
  local at="" w i
  local -a subs flags
${walk}
  if [[ \${words[CURRENT]} == -* ]]; then
    _describe -t options 'option' flags
  else
    _describe -t commands 'command' subs || _files
  fi
}
if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
  _agentenv "$@"
else
  compdef _agentenv agentenv
fi
`;
}

/** The `completion` command for the tree rooted at `root` (the binary's main command). */
export function completionCommand(root: CommandDef<any>) {
  return defineCommand({
    meta: { name: "completion", description: "print a shell completion script: agentenv completion bash|zsh" },
    args: { shell: { type: "positional", required: true, description: "bash or zsh" } },
    run: ({ args }) =>
      run(async () => {
        if (args.shell !== "bash" && args.shell !== "zsh") throw new CliError(`unknown shell ${JSON.stringify(args.shell)}: expected bash or zsh`);
        const tree = await commandTree(root);
        process.stdout.write(args.shell === "bash" ? bashScript(tree) : zshScript(tree));
      }),
  });
}
