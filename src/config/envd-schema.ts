/**
 * `[envd]`: the settings of the guest's daemon (`agentenv envd`), part of the one schema
 * (schema.ts). The tools drive carries this section as JSON (envd-section.json, generated) so
 * envd in the guest reads its settings without the host's config file.
 */
import { bool, int, list, MS_MAX, section, str, TIB } from "./fields.ts";

/** The `[envd]` section. */
export const ENVD_SECTION = section("In-guest daemon (`agentenv envd`), E2B envd protocol.", {
  host: str("0.0.0.0", "Bind address.", { minLength: 1 }),
  default_user: str("root", 'Acting user before POST /init sets one (E2B\'s envd default is root; templates set "user").', { minLength: 1 }),
  clock_sync: bool(true, "Set the guest clock from /init's timestamp when it is >50 ms behind or >5 s ahead. Guests only."),
  keepalive_interval_s: int(90, "Keepalive interval on streams when the client sends no Keepalive-Ping-Interval header, seconds.", { min: 1, max: 86_400, unit: "s" }),
  max_processes: int(1024, "Most processes running at once; more Start calls get resource_exhausted.", { min: 1, unit: "count" }),
  exited_retention_ms: int(30_000, "How long an exited process stays attachable with Connect (its end event is kept), ms.", { min: 0, max: MS_MAX, unit: "ms" }),
  kill_wait_ms: int(5000, "SendSignal with SIGKILL (the SDK's commands.kill) answers once the process is reaped, waiting at\nmost this long, ms.", { min: 0, max: MS_MAX, unit: "ms" }),
  output_drain_ms: int(
    100,
    "After a process exited, its output is read until no byte arrived for this long (background\nchildren may hold its pipes open), ms. Waiting for a slow client does not count.",
    { min: 0, max: 600_000, unit: "ms" },
  ),
  stream_queue_events: int(256, "Events buffered per open stream before process output reading pauses (back-pressure).", { min: 1, unit: "count" }),
  stream_queue_bytes: int(
    1_048_576,
    "Output bytes buffered per open process stream (Start/Connect) before envd stops reading the\nprocess's pipe, so a slow client blocks the writer instead of growing envd's memory.",
    { min: 1, max: TIB, unit: "bytes" },
  ),
  detached_output_bytes: int(262_144, "Output a process writes while no stream is attached to it (its client went away: a dropped\nconnection, a node restart) kept for the next Connect, which gets it first, bytes per process\n(the newest are kept). 0 drops it, as E2B's envd does.", { min: 0, max: 67_108_864, unit: "bytes" }),
  output_event_bytes: int(32_768, "Largest output payload of one data event, bytes (1..65536; E2B's envd reads 32 KiB at a time).", { min: 1, max: 65_536, unit: "bytes" }),
  output_pipe_bytes: int(
    1_048_576,
    "Capacity of each process's stdout and stderr pipe, bytes (F_SETPIPE_SZ; the kernel rounds up to\na power of two pages): a fast writer hands over up to this much per wake-up of envd. Kernel\nmemory, held only while output waits in the pipe (a process writing to a slow client holds up\nto twice this); not envd's RSS.",
    { min: 4096, max: 67_108_864, unit: "bytes" },
  ),
  output_batch_bytes: int(
    262_144,
    "Most output bytes written to a client before one flush (whole reads of the process's pipe, at\nleast one): fewer, larger socket writes when output is fast.",
    { min: 1, max: TIB, unit: "bytes" },
  ),
  gc_every_output_bytes: int(
    67_108_864,
    "Bytes of short-lived output buffers (all streams: JSON's base64 text, envelope headers) after\nwhich envd collects garbage at once; the runtime's own collector lets RSS climb tens of MiB\nfirst. Reads sent as binary payloads are not counted: they are freed once every stream sent\nthem. 0 = leave it to the runtime.",
    { min: 0, unit: "bytes" },
  ),
  stream_request_max_bytes: int(4_194_304, "Largest request message of a streaming call (Start/Connect: command, args, env), bytes.", { min: 1024, max: TIB, unit: "bytes" }),
  max_list_entries: int(100_000, "Most entries one ListDir answer holds; deeper/larger listings get resource_exhausted.", { min: 1, unit: "count" }),
  max_watchers: int(256, "Most polling watchers (CreateWatcher) at once.", { min: 1, unit: "count" }),
  max_watcher_events: int(10_000, "Events a polling watcher keeps between GetWatcherEvents calls; the oldest are dropped beyond it.", { min: 1, unit: "count" }),
  max_watch_dirs: int(8192, "Most directories one recursive watch follows (one inotify watch each).", { min: 1, unit: "count" }),
  idle_timeout_s: int(255, "HTTP idle timeout per connection, s (Bun caps it at 255); streams send keepalives well inside it.", { min: 0, max: 255, unit: "s" }),
  max_request_body_bytes: int(
    TIB,
    "Largest request body (uploads), bytes. Bodies are streamed to disk, never held whole; Bun's own\ndefault (128 MiB) would refuse bigger files. Default 1 TiB.",
    { min: 1, unit: "bytes" },
  ),
  upload_buffer_bytes: int(
    1_048_576,
    "No longer used; accepted so that configs naming it still load. Each chunk of an upload is now\nwritten as it arrives (about 64 KiB at a time): an octet-stream upload holds that one chunk, a\nmultipart one that chunk and the parser's tail of the one before.",
    { min: 65_536, max: 268_435_456, unit: "bytes" },
  ),
  max_compose_sources: int(10_000, "Most source files one POST /files/compose concatenates.", { min: 1, unit: "count" }),
  enforce_permissions: bool(
    false,
    "Check the acting user's rights on file operations (upload, download, list, make_dir, move,\nremove, watch): refusals are 403 / permission_denied. false = E2B's behaviour: envd acts as root\nand only ownership follows the user.",
  ),
  reseed_random: bool(
    true,
    "Mix POST /init's entropy (host random bytes, sent on every create, resume, fork and pool\nadoption) into the kernel random generator and reseed it (RNDADDENTROPY + RNDRESEEDCRNG), so\nclones of one snapshot stop sharing its CRNG state. Guests only (needs root).",
  ),
  ca_dir: str("/usr/local/share/ca-certificates", "Where POST /init's caBundle (PEM) is written, as agentenv-init.crt (Debian's extra-CA directory).", { minLength: 1 }),
  ca_bundle_path: str(
    "/etc/ssl/certs/ca-certificates.crt",
    "System CA bundle POST /init's caBundle is added to (replacing the one an earlier /init added);\nempty: none. Processes envd starts then get NODE_EXTRA_CA_CERTS, REQUESTS_CA_BUNDLE,\nSSL_CERT_FILE and CURL_CA_BUNDLE.",
  ),
  ca_update_command: str("", "Command that rebuilds the trust store after a new bundle (e.g. update-ca-certificates, seconds\nunder TCG); empty: none. Skipped if not installed."),
  jsc_options: str(
    "useBaselineJIT=0",
    "JavaScriptCore options for the guest's envd runtime, `name=value` separated by spaces (Bun reads\nthem as BUN_JSC_<name> at start; the tools drive's init sets them, envd's commands never see\nthem); empty: none. Under TCG, compiling envd's run-once start-up code with the baseline JIT\ncosts more than it saves: without it envd listens in 1.6 s instead of 2.3-2.9 s (bench/vm.ts)\nand QEMU translates less code; hot code is still optimised by the later tiers.",
    { pattern: "^([A-Za-z][A-Za-z0-9]*=[A-Za-z0-9._-]+( [A-Za-z][A-Za-z0-9]*=[A-Za-z0-9._-]+)*)?$" },
  ),
  runtime_env: str(
    "MIMALLOC_PURGE_DELAY=0 BUN_GC_TIMER_INTERVAL=30000",
    "Environment of the guest envd's own runtime, `NAME=VALUE` separated by spaces (the tools drive's\ninit sets it beside jsc_options; envd drops it before it starts anything); empty: none. An idle\nguest wakes for every runtime timer, and each wakeup costs the host a QEMU wakeup under TCG:\nthe default drops mimalloc's scavenger thread (freed memory is returned at once instead of by a\nthread waking every few hundred ms) and makes Bun's heap check every 30 s instead of every\nsecond (JavaScriptCore still collects as envd allocates). docs/density.md.",
    { pattern: "^([A-Z][A-Z0-9_]*=[A-Za-z0-9._-]+( [A-Z][A-Z0-9_]*=[A-Za-z0-9._-]+)*)?$" },
  ),
});
