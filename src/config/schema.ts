/**
 * The node configuration schema: every key, its type, default, range, unit and documentation.
 * This file is the one place a key is defined; `config/default.toml` is generated from it
 * (`bun run config:defaults`, checked by test/config/config.test.ts).
 *
 * Adding a key: add one line to the section's object below (the control plane's sections:
 * control-plane-schema.ts; envd's: envd-schema.ts) with `int`, `str`, `bool`, `oneOf`, `list` or `map` of fields.ts
 * (default, range, unit, doc comment), then run `bun run config:defaults` to regenerate
 * config/default.toml. Read it typed as `cfg.section.key` (type `Config`); a value
 * outside the range is refused at load time with the key named, so code need not re-check it.
 * Cross-key rules (low <= high, ranges that must not overlap) stay in the subsystem that owns the
 * keys (e.g. src/net/config.ts).
 */
import { type Static } from "@sinclair/typebox";
import { CONTROL_PLANE_SECTIONS } from "./control-plane-schema.ts";
import { ENVD_SECTION } from "./envd-schema.ts";
import { bool, int, list, map, MS_MAX, oneOf, section, str, TIB } from "./fields.ts";

/** Every key of the node configuration. */
export const CONFIG_SCHEMA = section("", {
  home_path: str("/var/lib/agentenv", "Data directory: SQLite database, API key, templates, snapshots, sandbox uppers.\nAENV_HOME_PATH overrides it.", { minLength: 1 }),
  runtime_path: str("/run/agentenv", "Transient state: sockets, pid files. AENV_RUNTIME_PATH overrides it.", { minLength: 1 }),

  api: section("", {
    addr: str("0.0.0.0:8000", "host:port the node API (and the sandbox proxy) listens on. AENV_API_ADDR overrides it.", { pattern: "^.+:[0-9]{1,5}$" }),
    key: str("", "API key clients send as X-API-Key. Empty: generated on first start and stored in\n$home_path/api-key. AENV_API_KEY overrides it."),
    max_body_bytes: int(1_048_576, "Largest request body the API accepts, bytes (sandbox proxy bodies are streamed, not bounded here).", { min: 1024, max: TIB, unit: "bytes" }),
    docs: bool(true, "Serve the OpenAPI document at /openapi.json and the offline explorer at /docs."),
    strict_bodies: bool(
      true,
      "Refuse a request body field its route does not know with 400 api.unknown_field naming it (the\nSDKs have no capability handshake: an ignored field would look granted). false: ignore such fields\nand log each once per route (for clients newer than the node).",
    ),
  }),

  console: section("The operators' console at /console/ (every node and the gateway) and its terminals.", {
    enabled: bool(true, "Serve the browser console at /console/ (the page is public; what it shows comes from the API\nwith the key the operator types in)."),
    refresh_ms: int(2000, "How often the console refreshes its lists, metrics and log tails, ms.", { min: 250, max: MS_MAX, unit: "ms" }),
    ticket_ttl_ms: int(30_000, "How long a terminal ticket (POST /sandboxes/{id}/terminal) stays valid, ms; it works once.", { min: 1000, max: MS_MAX, unit: "ms" }),
    max_terminals: int(32, "Terminals (PTY WebSockets) one node bridges at once.", { min: 1, max: 4096, unit: "count" }),
    auth_timeout_ms: int(10_000, "Longest wait for a terminal socket's first frame (its ticket), ms.", { min: 1, max: MS_MAX, unit: "ms" }),
    buffer_bytes: int(1_048_576, "Terminal output queued for a slow client before the node stops reading the shell's output, bytes.", { min: 4096, max: TIB, unit: "bytes" }),
  }),

  log: section("", {
    level: oneOf(["trace", "debug", "info", "warn", "error", "fatal", "silent"], "info", "pino level: trace, debug, info, warn, error, fatal, silent. AENV_LOG_LEVEL overrides it."),
  }),

  vm: section("", {
    driver: oneOf(["auto", "qemu", "firecracker"], "auto", 'VMM driver: "auto" (Firecracker when its binary is found, else QEMU), "qemu" or "firecracker".'),
    stop_timeout_ms: int(3000, "Longest wait (ms) for a VMM process to exit after a graceful stop before SIGKILL.", { min: 1, max: MS_MAX, unit: "ms" }),
    socket_timeout_ms: int(10_000, "Longest wait (ms) for the VMM's control socket (QMP / API socket) to appear after spawn.", { min: 1, max: MS_MAX, unit: "ms" }),
    boot_snapshots: bool(
      true,
      "Cold boots (a template without a memory snapshot, a create asking for another VM shape, a resume\nwithout memory) restore a boot snapshot instead of booting the kernel and envd: a VM of that\nshape (vCPUs, memory) booted once up to envd with no root filesystem, kept in the snapshot\nrepository (kind boot) and made on the first cold boot of a shape; the restored guest is told\nthe sandbox disk's size, mounts it and pivots into it. A create with volumes restores one made\nwith as many placeholder volume drives, and the guest re-probes each drive before it mounts the\nvolume. Templates with kernel arguments of their own and Firecracker nodes boot; a boot snapshot\nthat fails to restore makes its shape's cold boots boot for 10 minutes.",
    ),
    ksm: oneOf(
      ["off", "guest", "all"],
      "off",
      'Kernel samepage merging of sandboxes\' memory (docs/density.md). "guest": QEMU marks guest RAM\nmergeable (-machine mem-merge=on): equal pages that clones of one snapshot wrote are kept once.\n"all": the node process and everything it starts (VMMs, the disk daemon) have all their\nanonymous memory mergeable (prctl PR_SET_MEMORY_MERGE, Linux >= 6.7): QEMU\'s heap too, and\nFirecracker\'s guest memory. Either starts the host\'s ksmd (/sys/kernel/mm/ksm/run = 1, with\nuse_zero_pages) at node start. "off": guest RAM is not marked (mem-merge=off, where QEMU\'s own\ndefault is on), and the host\'s ksmd is left as it is. A change reaches the VMMs started after it,\nnot adopted ones. Merging lets one\nsandbox learn, by write timing, whether another holds a page of given content: leave it off\nwhere sandboxes of different tenants share a host. bench/density.ts --ksm: 20 idle sandboxes,\nmemory per sandbox beyond what its guest dirtied 58.5 / 47.2 / 43.1 MiB off / guest / all.',
    ),
    ksm_scan_secs: int(
      60,
      "With ksm on: the time of one full pass of ksmd over the mergeable pages, s, kept by the kernel's\nscan advisor (/sys/kernel/mm/ksm/advisor_mode scan-time, where the kernel has it), which sets\nksmd's rate from the number of pages (at least 500 per wakeup): 10 sandboxes cost ksmd 8% of a\ncore here, 400 about 22%, steered towards ksm_max_cpu_percent.\nA page is merged after two or three passes. 0, or a kernel without the advisor:\nksm_pages_to_scan.",
      { min: 0, max: 86_400, unit: "s" },
    ),
    ksm_max_cpu_percent: int(25, "With ksm on and the advisor: the bound on ksmd's CPU, % of one core (advisor_max_cpu).", { min: 1, max: 100, unit: "percent" }),
    ksm_pages_to_scan: int(
      1000,
      "With ksm on and no advisor (ksm_scan_secs 0, or an older kernel): pages ksmd scans per wakeup\n(/sys/kernel/mm/ksm/pages_to_scan, every sleep_millisecs: 20 ms by default); 0 leaves the host's\nvalue. 1000 here: ksmd 15-30% of a core whatever the number of sandboxes, a pass over 400\nsandboxes in about 2.5 minutes; the kernel's default 100 takes 25.",
      { min: 0, max: 1_000_000, unit: "count" },
    ),
    console_max_bytes: int(4_194_304, "Guest serial console log per VM (<workDir>/console.log): rotated to console.log.1 when it\nwould pass this many bytes, so at most twice this is kept.", { min: 4096, max: TIB, unit: "bytes" }),
  }),

  qemu: section("", {
    binary: str("qemu-system-x86_64", "QEMU system emulator (Debian package qemu-system-x86).", { minLength: 1 }),
    accel: oneOf(["auto", "kvm", "tcg"], "auto", '"auto": KVM when /dev/kvm can run ordinary guests (not kvm_pvm), else TCG. Or "kvm" / "tcg".'),
    cpu: str("max", '-cpu model. Bun needs x86-64-v2, which QEMU\'s default qemu64 lacks: keep "max" under TCG.', { minLength: 1 }),
    tsc_khz: int(0, 'Guest TSC frequency hint in kHz (tsc_early_khz=, required on microvm/TCG); 0 reads the\nhost\'s "cpu MHz" from /proc/cpuinfo.', { min: 0, unit: "kHz" }),
    tcg_tb_size_mib: int(
      256,
      "TCG translation cache of a booted VM in MiB (-accel tcg,tb-size=); 0 keeps QEMU's default (1 GiB\non 64-bit hosts, filled as the guest runs new code, so a long-lived sandbox's QEMU keeps growing).\nUnder TCG this cache is most of QEMU's own memory per VM; a cold boot alone translates about\n88 MiB. bench/vm.ts --tb-sizes 32,256 (5 interleaved boots each + a python3 command run twice,\nload 0.8-1.0): QEMU PSS beyond guest RAM 90 vs 153 MiB at envd ready and 89 vs 202 MiB after the\ncommand; QEMU CPU to envd ready 5.6 vs 4.8 s; the command 13.2 / 11.7 vs 14.6 / 11.4 s (32: 9\nwhole-cache flushes and retranslations by its end). Earlier (before envd's JIT option): 64\ncost 10-20% more guest CPU time, the default 233 MiB. Booted VMs are template builds and\nfilesystem-only resumes: 256 bounds the growth without slowing them. Restored VMs:\ntcg_tb_size_restore_mib. Ignored under KVM.",
      { min: 0, max: 65536, unit: "MiB" },
    ),
    tcg_tb_size_restore_mib: int(
      32,
      "TCG translation cache in MiB of a VM restored from a snapshot (most sandboxes); 0 keeps QEMU's\ndefault. A restored guest translates only what it runs from then on (10 MiB to envd ready, the\nwhole cache after its first commands: each is a login bash), and the cache stays resident for the\nVM's life: the largest part of an idle sandbox's host memory beyond its guest's. Smaller saves\nmemory and costs every command: a full cache is flushed whole and the kernel, envd and bash are\ntranslated again. Two nodes side by side, 8 interleaved creates each (load 8): first\ncommands.run p50 1955 / 1161 / 856 ms, the next 1639 / 1048 / 775 ms at 16 / 24 / 32;\nbench/density.ts (10 idle sandboxes): 43.5 vs 61 MiB per sandbox beyond what its guest dirtied\nat 16 vs 32; bench/vm.ts --restores-only: QEMU CPU for a python3 pair 16.2 vs 15.0 s.\ndocs/density.md.",
      { min: 0, max: 65536, unit: "MiB" },
    ),
    qmp_timeout_ms: int(30_000, "Longest wait (ms) for one QMP command (migrations included).", { min: 1, max: MS_MAX, unit: "ms" }),
    free_page_reporting: bool(
      true,
      "Give booted VMs a virtio-balloon device with free page reporting: memory the guest frees (in 2 MiB\nblocks, about 2 s later: the guest init sets page_reporting_order 9) goes back to the host instead of staying with QEMU until the sandbox\nends. Snapshots keep the device (a restore has it when the snapshot's VM had it); changing this\nremakes template and boot snapshots. docs/density.md.",
    ),
    memory_dir: str("/dev/shm/agentenv", "Directory of the guest RAM files of booted VMs (<dir>/<vm id>.mem, mapped shared so snapshots\nneed not stream RAM). A tmpfs keeps guest RAM off the disk.", { minLength: 1 }),
  }),

  kernel: section("", {
    path: str("", "Guest kernel to boot. Empty: the one `agentenv kernel build` made for this source and fragment\n($home_path/kernels/<key>/vmlinux). Any PVH ELF vmlinux path may be named instead."),
    source_tarball: str("/usr/src/linux-source-6.1.tar.xz", "Debian kernel source tarball that `kernel build` unpacks, and the package that ships it\n(its version enters the cache key).", { minLength: 1 }),
    source_package: str("linux-source-6.1", "", { minLength: 1 }),
    jobs: int(0, "make -j for `kernel build`; 0 uses every CPU.", { min: 0, max: 1024, unit: "count" }),
  }),

  tools: section("The read-only tools drive every VM boots through (src/tools): guest init, envd, glibc, busybox.", {
    busybox: str("/bin/busybox", "Static busybox copied onto the drive (Debian busybox-static): the guest init's shell and a\nfallback userland at the end of the guest's PATH.", { minLength: 1 }),
    binaries: list(
      ["/usr/bin/ss", "/usr/bin/curl"],
      "Host programs copied onto the drive with their shared libraries, at the end of the guest's PATH:\ntemplate ready checks (`ss`, `curl`) work even when the image has neither.",
    ),
  }),

  template: section("", {
    suite: str("bookworm", "Debian suite of the base template (mmdebstrap).", { minLength: 1 }),
    mirror: str("", "Debian mirror for mmdebstrap. Empty: the first http(s) deb URL in this host's apt sources."),
    packages: list(["ca-certificates", "iproute2", "procps", "sudo", "curl", "git", "python3", "fio"], "Packages added to mmdebstrap's minbase variant."),
    rootfs_size_mib: int(2048, "Size of the base root filesystem image in MiB (ext4; the guest sees this much disk).", { min: 64, max: 1_048_576, unit: "MiB" }),
    tool_timeout_ms: int(3_600_000, "Bound on one tool run of `template build-base` (mmdebstrap, mkfs.ext4).", { min: 1000, max: MS_MAX, unit: "ms" }),
    cpu_count: int(1, "vCPUs and memory (MiB) of sandboxes of the base template: it is booted once with this shape\nand committed as a snapshot, which every sandbox of it is restored from.", { min: 1, max: 32, unit: "count" }),
    memory_mib: int(512, "", { min: 128, max: 1_048_576, unit: "MiB" }),
    snapshot: bool(true, "End `template build-base` by booting the image once, waiting for envd and committing the\nrunning VM as the template's snapshot (sandboxes are then restores, not cold boots)."),
    snapshot_ready_timeout_ms: int(180_000, "Longest wait for envd in that VM to answer and run a first command.", { min: 1000, max: MS_MAX, unit: "ms" }),
  }),

  snapshot: section("Snapshots: committed sandbox and template state (disk and memory overlaybd layers + VMM state).", {
    path: str("", "Local repository directory (layers/, manifests/, staging/). Empty: $home_path/snapshots."),
    verify_digests: bool(true, "Check a layer's sha256 against its digest the first time a node process restores from it\n(and again whenever the file changed); a mismatch fails the restore with snapshot.corrupt_layer."),
    gc_grace_secs: int(600, "An unreferenced layer or staging folder younger than this is left alone by garbage\ncollection (another process, e.g. a template build, may be committing it). Layers that a dead\nprocess's commit recorded in its staging folder go at once.", { min: 0, max: 86_400, unit: "s" }),
    gc_interval_secs: int(3600, "Period of the repository's garbage collection (it also runs at start and after deletes);\n0 = only then.", { min: 0, max: 86_400, unit: "s" }),
    warm_images: int(
      2,
      "Memory images of template and user snapshots kept open after the last sandbox restored from\nthem stopped (the most recently restored ones): the host page cache then keeps the pages\nrestores fault in, so the next create from that snapshot finds its working set cached instead\nof reading it again through the disk daemon. Each costs one shared export in the disk daemon\nand the page cache it holds (reclaimable). An image goes when its snapshot is deleted or\nreplaced. 0 = an image closes with its last sandbox.",
      { min: 0, max: 64, unit: "count" },
    ),
    cache_max_bytes: int(
      21_474_836_480,
      "With [snapshot.s3]: bytes of layer files the local repository keeps. Past it, the least recently\nused layers that the object store holds and no running sandbox uses are removed (fetched again\nwhen a restore needs them). Layers in use are kept even past it. 0 = no limit.",
      { min: 0, unit: "bytes" },
    ),
    s3: section("S3-compatible object store of committed snapshots (Bun's S3 client): snapshots are pushed to it\nafter commit, and a restore of a snapshot whose manifest or layers this node lacks fetches them\nfrom it (digests checked) into the local repository, which then acts as an LRU layer cache.", {
      bucket: str("", "Bucket. Empty: no object store (snapshots stay on this node)."),
      prefix: str("agentenv/", 'Key prefix of every object (manifests/<id>.json, layers/sha256/<hex>); "" or ending in "/".', { pattern: "^([A-Za-z0-9!_.*'()=+-]+/)*$" }),
      endpoint: str("", "Endpoint URL of an S3-compatible store (http://127.0.0.1:9000). Empty: AWS S3 of the region."),
      region: str("us-east-1", "Region the requests are signed for.", { minLength: 1 }),
      virtual_hosted_style: bool(false, "Address the bucket as <bucket>.<endpoint host> (AWS style) instead of <endpoint>/<bucket> (path style)."),
      access_key_id: str("", "Credentials. Empty: Bun's S3 client reads S3_ACCESS_KEY_ID / AWS_ACCESS_KEY_ID and\nS3_SECRET_ACCESS_KEY / AWS_SECRET_ACCESS_KEY. AENV_SNAPSHOT_S3_ACCESS_KEY_ID and\nAENV_SNAPSHOT_S3_SECRET_ACCESS_KEY override them (keep secrets out of config files)."),
      secret_access_key: str("", ""),
      push_kinds: list(["template", "user"], "Snapshot kinds pushed after commit (template, user, fork, pause, boot). Pause, fork and boot snapshots\nare one node's own and are not pushed by default; a layer is only ever evicted\nfrom the local cache once the store holds it."),
      part_size_mib: int(16, "Multipart upload part size of a layer.", { min: 5, max: 5120, unit: "MiB" }),
      upload_concurrency: int(4, "Parts of one layer uploaded at once.", { min: 1, max: 64, unit: "count" }),
      retries: int(3, "Retries of a failed request (Bun's client, with backoff).", { min: 0, max: 255, unit: "count" }),
      shutdown_wait_ms: int(120_000, "Longest wait at node shutdown for pushes in progress (what is left is pushed at the next start).", { min: 0, max: MS_MAX, unit: "ms" }),
      sync_interval_secs: int(600, "Period of pushing committed snapshots the store still lacks (a failed or interrupted push is\ntried again then; also at start). 0 = only at start.", { min: 0, max: 86_400, unit: "s" }),
    }),
  }),

  // [image]: reaching registries (issue 33); one block, kept together so it moves as one
  image: section(
    "Reaching container registries (template base images, remote overlaybd lowers): mirrors, trust,\ncredentials, and the HTTP(S) proxy of the node's outbound requests. docs/image-pulls.md.",
    {
      registry_mirrors: map(
        "^[A-Za-z0-9.-]+(:[0-9]{1,5})?$",
        'Mirrors tried in order before a registry itself: registry host -> list of mirror endpoints\n(host[:port][/path prefix]), e.g. "docker.io" = ["127.0.0.1:5000", "mirror.example:443"]. docker.io\nalso stands for index.docker.io and registry-1.docker.io; its one-part names are library/<name> on\nthe mirror too. Loopback mirrors and insecure_registries are reached over plain HTTP, the others\nover verified TLS. A mirror that fails is logged by name and the next one tried; a mirror whose\nmanifest does not match a pinned @sha256: digest fails the pull.',
      ),
      mirror_only: list([], "Registries (as keyed in registry_mirrors) never reached themselves: only their mirrors are."),
      insecure_registries: list(
        [],
        "Registries and mirrors (host or host:port) reached over plain HTTP / without verifying TLS.\nLoopback ones (localhost, 127.0.0.0/8, ::1) always are, as Docker treats them; others need TLS.",
      ),
      ca_path: str("", "PEM file, or directory of *.crt / *.pem files, of CA certificates trusted for registries and\nmirrors besides the system's."),
      auth_file: str(
        "",
        'Docker config.json with registry credentials ("auths": per registry "auth" = base64(user:password),\nor "username" + "password", or an "identitytoken"), read at each pull. Credentials a build request\nbrings (the SDK\'s fromImage(ref, {username, password})) win for the image\'s own registry; mirrors\nonly ever get the entries of this file. Credentials never appear in logs or API answers.',
      ),
      proxy: str(
        "",
        "HTTP(S) proxy URL (http://[user:password@]host:port) for the node's outbound requests: registry\npulls, the S3 snapshot store, webhooks. Empty: HTTPS_PROXY / HTTP_PROXY of the environment (then\nNO_PROXY too). Loopback, the sandbox networks and the scheduler are always reached directly.",
      ),
      no_proxy: list([], "Hosts reached directly when proxy is set (NO_PROXY syntax: host, .domain, IP, CIDR, host:port, *)."),
    },
  ),

  template_build: section("Template builds through the API (E2B Template SDK) and `agentenv template build|pull`.", {
    insecure_registries: list([], "Deprecated: read as [image] insecure_registries (a line in the log says so when set)."),
    default_base: str("base", "What a build without a base starts from (the SDK's default `e2bdev/base`): a template name.", { minLength: 1 }),
    default_cpu_count: int(2, "Build VM vCPUs and memory (MiB) when the build request names none.", { min: 1, max: 32, unit: "count" }),
    default_memory_mb: int(1024, "", { min: 128, max: 1_048_576, unit: "MiB" }),
    max_concurrent_builds: int(1, "Builds running at once; later ones stay `waiting` until one ends.", { min: 1, max: 64, unit: "count" }),
    step_timeout_ms: int(3_600_000, "Bound on one step (RUN, COPY, WORKDIR, USER); a step past it fails the build.", { min: 1000, max: MS_MAX, unit: "ms" }),
    ready_timeout_ms: int(600_000, "Bound on the ready command after the start command, at build and at sandbox start (E2B: 10 min).", { min: 1000, max: MS_MAX, unit: "ms" }),
    ready_poll_ms: int(2000, "Period of polling the ready command during a build (E2B: 2 s).", { min: 10, max: 60_000, unit: "ms" }),
    create_ready_poll_ms: int(200, "Period of polling a template's ready command while a sandbox of it starts (the create\nwaits for it).", { min: 10, max: 60_000, unit: "ms" }),
    vm_boot_timeout_ms: int(180_000, "Bound on booting a build VM until its envd answers.", { min: 1000, max: MS_MAX, unit: "ms" }),
    ready_probe_timeout_ms: int(60_000, "Bound on one run of the ready command (at build and at sandbox start).", { min: 1000, max: MS_MAX, unit: "ms" }),
    vm_flush_timeout_ms: int(120_000, "Bound on flushing a build VM's filesystem (sync, fsfreeze) before a step's layer is taken.", { min: 1000, max: MS_MAX, unit: "ms" }),
    tool_timeout_ms: int(1_800_000, "Bound on one skopeo / umoci / mkfs run of an image pull.", { min: 1000, max: MS_MAX, unit: "ms" }),
    manifest_timeout_ms: int(
      60_000,
      "Bound on asking a registry for an image's manifest (the first contact of a pull): a dead\nregistry fails the build in this time instead of holding a build slot for tool_timeout_ms.",
      { min: 1000, max: MS_MAX, unit: "ms" },
    ),
    image_headroom_mib: int(2048, "Free space added to a pulled image's files for its root filesystem (sparse: costs nothing\nuntil written).", { min: 0, max: 1_048_576, unit: "MiB" }),
    image_min_disk_mib: int(1024, "Smallest root disk of a pulled image.", { min: 16, max: 1_048_576, unit: "MiB" }),
    upload_url_ttl_secs: int(1800, "Lifetime of the upload URL `GET /templates/{id}/files/{hash}` returns.", { min: 1, max: 86_400, unit: "s" }),
    max_upload_bytes: int(4_294_967_296, "Largest uploaded file archive of a COPY step.", { min: 1, unit: "bytes" }),
    log_max_bytes: int(
      16_777_216,
      "Largest build log (one per build); past it one truncation line is written and only errors\nafter it.",
      { min: 4096, max: 1_073_741_824, unit: "bytes" },
    ),
    gc_interval_ms: int(600_000, "Period of collecting template files no template, sandbox or snapshot uses (layers, trimmed\nstep and image cache, old uploads); also after each template delete.", { min: 1000, max: MS_MAX, unit: "ms" }),
    cache_max_bytes: int(
      53_687_091_200,
      "Disk the build cache (step layers and pulled images no template boots from) may keep; the\nleast recently used entries go first.",
      { min: 0, unit: "bytes" },
    ),
    gc_min_age_ms: int(600_000, "Files younger than this are never collected (one being written is not yet named by its record).", { min: 0, max: MS_MAX, unit: "ms" }),
    upload_max_age_secs: int(86_400, "Uploaded COPY archives older than this are collected (the SDK uploads again when a build needs them).", { min: 60, max: 31_536_000, unit: "s" }),
    error_output_chars: int(1500, "Characters of a failed command's output kept in a build's error reason.", { min: 100, max: 1_048_576, unit: "count" }),
    snapshot: bool(
      true,
      "End each build in a committed snapshot: a fresh VM of the build's last layer runs the start\nand ready commands, then is committed, and sandboxes of the build are restores of it (the\nstart command already running). false: builds end in disk layers; sandboxes cold-boot and run\nthe start command themselves.",
    ),
  }),

  node: section("", {
    id: str(
      "",
      "Node id shown by GET /nodes and sent in scheduler heartbeats. Empty: derived from the host\nname. In a cluster it must equal the id discovery gives the node ([scheduler] nodes entry, or\nthe Pod name with Kubernetes discovery). AENV_NODE_ID overrides it.",
    ),
    cluster_id: str("local", "Cluster id shown by GET /nodes and sent in heartbeats (single-node deployments keep the\ndefault). AENV_CLUSTER_ID overrides it.", { minLength: 1 }),
    service_instance_id: str("", "Id of this node process, sent with heartbeats and UnregisterNode (a late unregister of an old\nprocess must not remove its successor). Empty: a random id per start."),
  }),

  cluster: section("", {
    scheduler_endpoint: str(
      "",
      "The scheduler's gRPC address (host:port, or http://host:port) that nodes report to and the\ngateway asks. Empty: no scheduler (a single node). AENV_OBSERVABILITY_SCHEDULER_ENDPOINT\noverrides it for the node's reporter.",
    ),
    up: section("`agentenv cluster up`: a scheduler, a gateway and N nodes as child processes on one host.", {
      ready_timeout_ms: int(120_000, "Longest wait for a member's ready line after it is started, ms; then it is killed and the\nstart counts as failed.", { min: 1, max: MS_MAX, unit: "ms" }),
      stop_timeout_ms: int(60_000, "Longest wait for a member to exit after SIGTERM at shutdown, ms (a node may be pausing\nsandboxes); then SIGKILL.", { min: 1, max: MS_MAX, unit: "ms" }),
      node_restart_delay_ms: int(5000, "Pause before a node that died (or failed to start again) is started again, ms.\n`--node-restart-delay` overrides it.", { min: 0, max: MS_MAX, unit: "ms" }),
      service_restart_delay_ms: int(500, "Pause before the scheduler or the gateway is started again after it died (or failed to\nstart again), ms.", { min: 0, max: MS_MAX, unit: "ms" }),
    }),
  }),

  observability: section("", {
    scheduler_report: section("", {
      enabled: bool(
        false,
        "Send Heartbeat every interval (node snapshot: identity, machine, host CPU/memory/disk,\ncounters, the full sandbox roster) and UnregisterNode on shutdown. Needs\n[cluster] scheduler_endpoint. AENV_OBSERVABILITY_SCHEDULER_REPORT_ENABLED overrides it.",
      ),
      interval_secs: int(5, "Seconds between heartbeats. AENV_OBSERVABILITY_REPORT_INTERVAL_SECS overrides it. The\nscheduler's [scheduler] report_ttl_secs should be about twice this.", { min: 1, max: 86_400, unit: "s" }),
      timeout_ms: int(3000, "Bound on one Heartbeat, ReportSandboxEvent or UnregisterNode call, ms.", { min: 1, max: MS_MAX, unit: "ms" }),
      event_flush_ms: int(100, "Sandbox lifecycle events are sent (ReportSandboxEvent) this long after the first one queued,\ntogether with those queued meanwhile, ms.", { min: 0, max: MS_MAX, unit: "ms" }),
      event_batch_max: int(1000, "Most sandbox events in one ReportSandboxEvent call; more are sent in further calls.", { min: 1, max: 1_000_000, unit: "count" }),
    }),
  }),

  ...CONTROL_PLANE_SECTIONS,

  orchestrator: section("", {
    default_timeout_secs: int(300, "Sandbox lifetime when a create request omits `timeout`, seconds (E2B SDKs default to 300).", { min: 1, unit: "s" }),
    max_timeout_secs: int(86_400, "Largest `timeout` a request may ask for, seconds (86400 = 24 h).", { min: 1, unit: "s" }),
    max_sandboxes: int(16, "Bound on live sandboxes (starting + running); further creates answer 429.", { min: 1, unit: "count" }),
    max_concurrent_starts: int(2, "Bound on sandboxes booting or resuming at once; further ones wait their turn.", { min: 1, unit: "count" }),
    create_timeout_ms: int(120_000, "Bound on one create or resume (boot + envd ready + init), ms.", { min: 100, max: MS_MAX, unit: "ms" }),
    pause_timeout_ms: int(120_000, "Bound on one pause (VM pause + snapshot), ms.", { min: 100, max: MS_MAX, unit: "ms" }),
    lock_wait_ms: int(180_000, "Bound on waiting behind another operation on the same sandbox, ms; then 409.", { min: 1, max: MS_MAX, unit: "ms" }),
    lock_max_waiters: int(32, "Bound on operations queued on one sandbox; further ones answer 409.", { min: 1, unit: "count" }),
    evict_interval_ms: int(
      1000,
      "No longer used; accepted so that configs naming it still load. Expired sandboxes are killed (or\npaused, with autoPause) by one timer armed at the earliest deadline, not by a periodic scan.",
      { min: 10, max: MS_MAX, unit: "ms" },
    ),
    killed_retention_secs: int(3600, "How long killed and failed sandbox records stay in the database, seconds.", { min: 0, unit: "s" }),
    shutdown_action: oneOf(
      ["kill", "pause", "detach"],
      "kill",
      'What a graceful shutdown (SIGINT/SIGTERM) does with running sandboxes: "kill"; "pause" (memory\nand disk kept, resumed on connect); or "detach": left running (VMMs, disks, slots) for the next\nnode started on the same runtime path to adopt, as after a crash (an upgrade: stop, replace the\nbinary, start; docs/survival.md). A crash (kill -9) leaves them running whatever this says.',
    ),
    default_cpu_count: int(1, "vCPUs and memory (MiB) of a sandbox whose template does not say.", { min: 1, max: 255, unit: "count" }),
    default_memory_mb: int(512, "", { min: 128, max: 1_048_576, unit: "MiB" }),
    max_cpu_count: int(
      8,
      "Largest vCPU count and memory (MiB) one sandbox may have, from its template or from the create\nrequest's cpuCount / memoryMB; larger asks answer 400 naming the limit. (QEMU accepts at most 32\nvCPUs; memory below 128 MiB is refused as E2B does.)",
      { min: 1, max: 32, unit: "count" },
    ),
    max_memory_mb: int(16_384, "", { min: 128, max: 1_048_576, unit: "MiB" }),
    envd_poll_ms: int(20, "Period of polling envd's /health while a sandbox boots, ms.", { min: 1, max: 60_000, unit: "ms" }),
  }),

  metrics: section("", {
    sample_interval_ms: int(
      5000,
      "Sandbox resource samples (GET /sandboxes/{id}/metrics, Prometheus /metrics) are the guest's view\n(vCPUs, CPU %, memory, disk), asked of its envd. A sandbox whose metrics someone read in the\nlast watch_ms is sampled this often, ms; a read that finds no sample this recent takes one first.",
      { min: 100, max: MS_MAX, unit: "ms" },
    ),
    watch_ms: int(
      60_000,
      "How long a sandbox stays sampled every sample_interval_ms after its metrics were read through\nGET /sandboxes/{id}/metrics or /sandboxes/metrics, ms (a Prometheus scrape takes fresh samples\nwithout extending this).",
      { min: 0, max: MS_MAX, unit: "ms" },
    ),
    idle_sample_interval_ms: int(
      600_000,
      "Sampling period of running sandboxes nobody reads metrics of, ms; 0: none. Every sample wakes an\nidle guest (docs/density.md).",
      { min: 0, max: MS_MAX, unit: "ms" },
    ),
    sample_timeout_ms: int(2000, "Bound on one sample (envd's /metrics answer), and on how long a read waits for fresh samples,\nms; a sandbox that does not answer in time is tried again later.", { min: 10, max: MS_MAX, unit: "ms" }),
    max_concurrent_samples: int(16, "Most samples in flight at once (a Prometheus scrape of many sandboxes queues behind it).", { min: 1, max: 1024, unit: "count" }),
    history_samples: int(
      720,
      "Samples kept per sandbox (oldest dropped first): 720 x 5 s = the last hour. The history is\nkept in memory while the sandbox lives (also while it is paused) and dropped when it is killed.",
      { min: 1, unit: "count" },
    ),
  }),

  logs: section(
    "Sandbox logs (GET /sandboxes/{id}/logs, /v2/sandboxes/{id}/logs): lifecycle events, the guest\nconsole and envd's own lines, stored in the node database.",
    {
      max_entries_per_sandbox: int(10_000, "Entries kept per sandbox; the oldest are deleted first. Kept while the sandbox is paused,\ndeleted with the sandbox's record.", { min: 1, unit: "count" }),
      max_line_bytes: int(4096, "Longest stored message, bytes (a longer console line is cut; the rest starts a new entry).", { min: 64, unit: "bytes" }),
      flush_interval_ms: int(250, "New lines are written to the database in batches this often, ms (a query writes them first).", { min: 1, max: MS_MAX, unit: "ms" }),
      max_pending_lines: int(
        20_000,
        "Bound on lines waiting for the next batch; beyond it the oldest waiting lines are dropped\n(and counted in the log as one warning entry).",
        { min: 1, unit: "count" },
      ),
    },
  ),

  events: section(
    "Sandbox lifecycle events (GET /events/sandboxes, /events/sandboxes/{id}) and signed webhooks\n(/events/webhooks), stored in the node database (docs/events.md).",
    {
      retention_hours: int(168, "How long events and webhook delivery attempts are kept, hours (E2B keeps 7 days). An event not\ndelivered to a webhook by then is dropped from its queue.", { min: 1, max: 87_600, unit: "h" }),
      prune_interval_ms: int(60_000, "Period of the scan that deletes events and delivery attempts older than retention_hours, ms.", { min: 10, max: MS_MAX, unit: "ms" }),
      max_webhooks: int(100, "Most webhooks one node holds; more registrations answer 429 (E2B: WEBHOOK_LIMIT_REACHED).", { min: 1, max: 10_000, unit: "count" }),
      webhook_queue_max: int(
        10_000,
        "Events waiting for delivery to one webhook (on disk); beyond it the oldest waiting event of that\nwebhook is dropped (logged, counted). Other webhooks' queues are not touched.",
        { min: 1, unit: "count" },
      ),
      webhook_timeout_ms: int(10_000, "Bound on one delivery (connect, request, response headers and body), ms; then it counts as failed.", { min: 1, max: MS_MAX, unit: "ms" }),
      webhook_retry_initial_ms: int(1000, "Wait before the first retry of a failed delivery, ms; each further failure doubles it.", { min: 1, max: MS_MAX, unit: "ms" }),
      webhook_retry_max_ms: int(300_000, "Longest wait between retries of a failing delivery, ms. A webhook delivers its events in order:\nwhile its receiver fails, its later events wait.", { min: 1, max: MS_MAX, unit: "ms" }),
      webhook_response_body_bytes: int(4096, "Bytes of a receiver's response body kept in the delivery log.", { min: 0, max: 1_048_576, unit: "bytes" }),
      max_attempts_logged: int(10_000, "Delivery attempts kept per webhook (the oldest are deleted first), besides retention_hours.", { min: 1, unit: "count" }),
    },
  ),

  volumes: section(
    "Persistent volumes (POST /volumes, volumeMounts on create, /volumecontent/{id}/...): an ext4\nfilesystem inside an overlaybd image in $home_path/volumes/<id>/, attached to sandboxes as an\nextra drive.",
    {
      size_mib: int(1024, "Size of a new volume's filesystem, MiB (sparse: unused space costs nothing).", { min: 16, max: 16 * 1024 * 1024, unit: "MiB" }),
      max_mounts_per_sandbox: int(8, "Most volumes one sandbox may mount.", { min: 1, max: 16, unit: "count" }),
      default_uid: int(1000, "Owner (uid, gid) of a new volume's root directory and of what the content API creates without\nexplicit uid/gid: the templates' `user` account.", { min: 0, max: 4_294_967_294, unit: "count" }),
      default_gid: int(1000, "", { min: 0, max: 4_294_967_294, unit: "count" }),
      host_idle_ms: int(10_000, "The content API mounts a volume nobody holds on the node; the mount is kept this long after the\nlast operation, ms (a sandbox attaching the volume closes it at once).", { min: 0, max: MS_MAX, unit: "ms" }),
      max_list_entries: int(10_000, "Most entries one directory listing returns.", { min: 1, unit: "count" }),
      detach_timeout_ms: int(10_000, "Bound on syncing and unmounting a sandbox's volumes in the guest before its VM is killed, ms.", { min: 1, max: MS_MAX, unit: "ms" }),
      guest_op_timeout_ms: int(30_000, "Bound on one file operation done through a sandbox's envd (commands, not transfers), ms.", { min: 1, max: MS_MAX, unit: "ms" }),
    },
  ),

  sandbox_proxy: section("", {
    domains: list(
      [],
      "DNS suffixes accepted for host-based routes {port}-{sandboxID}.{domain}; the first one is\nreturned to SDKs as the sandbox `domain`. Empty: header and /proxy routing only.\nAENV_SANDBOX_PROXY_DOMAINS overrides it (comma-separated).",
    ),
    connect_timeout_ms: int(
      30_000,
      "Bound on connecting to a sandbox port with a request that has a body, ms: until the port starts\nreading the body; then 502. (A request without a body is bounded by response_timeout_ms: the\nproxy cannot tell its connect from the wait for the answer.)",
      { min: 1, max: MS_MAX, unit: "ms" },
    ),
    response_timeout_ms: int(
      300_000,
      "Longest wait for a sandbox port's response headers once the request is sent, ms: from the\nrequest body's end, or for a request without a body from its start (connecting included);\nthen 502. Long enough for slow and long-polling endpoints; the body then streams unbounded.",
      { min: 1, max: MS_MAX, unit: "ms" },
    ),
    idle_timeout_ms: int(
      120_000,
      "Once a request body streams: the longest pause between its chunks, ms; then the request is cut\n(502 if nothing was answered yet). A body may stream for as long as it keeps moving.",
      { min: 1, max: MS_MAX, unit: "ms" },
    ),
    settle_timeout_ms: int(
      130_000,
      "A request for a sandbox that is being created, paused or resumed waits at most this long for it\nto settle before it is routed, ms; keep it above [orchestrator] create_timeout_ms, which bounds\nthe create or resume it waits for.",
      { min: 1, max: MS_MAX, unit: "ms" },
    ),
    block_envd_internal: bool(true, "Refuse envd's host-only routes (/init, /freeze, ...) arriving through the proxy."),
    tls_cert_path: str(
      "",
      "PEM certificate chain (and its key, below) for an HTTPS listener serving the API and the sandbox proxy,\nwhose certificate should cover *.{domain} for each of `domains`: the E2B SDKs build\nhttps://{port}-{sandboxID}.{domain} URLs whenever E2B_SANDBOX_URL is not set. Both empty: no HTTPS.",
    ),
    tls_key_path: str("", "PEM private key of tls_cert_path."),
    https_addr: str("0.0.0.0:443", "host:port of the HTTPS listener (used when tls_cert_path and tls_key_path are set).", { pattern: "^.+:[0-9]{1,5}$" }),
  }),

  disk: section(
    "Sandbox disks are served by one long-lived disk daemon per node (`agentenv ublk-daemon`, its\nfiles under <runtime_path>/disk/): FUSE files, or ublk block devices where the kernel has ublk.",
    {
      export: oneOf(["auto", "ublk", "fuse"], "auto", 'Engine: "auto" (ublk when /dev/ublk-control exists, else FUSE), "ublk" or "fuse".'),
      fuse_threads: int(2, "FUSE reader threads of the daemon, shared by every export (1..16).", { min: 1, max: 16, unit: "count" }),
      fuse_max_write: int(
        524_288,
        "Largest FUSE READ/WRITE in bytes (multiple of 4096, at most 1048576 = max_pages 256). The default,\n128 pages, splits a 1 MiB O_DIRECT read into two READs of 512 KiB that the two reader threads\nanswer in parallel, each spliced through a pipe of the default fs.pipe-max-size (1 MiB = 256\nslots: a READ and its reply header must fit; see fuse_splice). bench/disk.ts, 1 MiB O_DIRECT\nsequential QD1, four interleaved runs: 0.41-0.51x of the hot backing file (raw file) at 128\npages vs 0.26-0.37x at 255 (1020 KiB + 4 KiB: one thread does nearly all the work); QD4 and\n4 KiB reads the same within noise. Earlier: 255 pages 0.38x vs 0.23x at 256, whose 1 MiB READs\ndo not fit the pipe and are copied.",
        { min: 4096, max: 1_048_576, multipleOf: 4096, unit: "bytes" },
      ),
      fuse_splice: bool(true, "Answer FUSE READs of 64 KiB and more with splice(2): file pages go to /dev/fuse through a pipe\nwith one copy instead of two. A READ must fit the pipe with its header's page: a pipe of the\ndefault fs.pipe-max-size (1 MiB, 256 slots) takes READs of up to 255 pages (1020 KiB); a larger\none is copied."),
      fuse_read_ahead_bytes: int(
        1_048_576,
        "Readahead window of each FUSE export in bytes (the mount's read_ahead_kb, set by the daemon once\nthe kernel's INIT is answered); 0 keeps the kernel's 128 KiB. A VMM reading the export through\nthe page cache (QEMU's default cache=writeback) then reads a sequential stream in windows of this\nsize, each sent as READs of at most fuse_max_write (the defaults: two spliced READs of 512 KiB,\nasynchronous, so both reader threads serve one window) instead of 128-256 KiB ones.",
        { min: 0, max: 67_108_864, multipleOf: 4096, unit: "bytes" },
      ),
      fuse_direct_io: bool(false, "Open served files with FOPEN_DIRECT_IO (no host page cache for the file). QEMU cache=none\nalready bypasses it; false keeps buffered readers (Firecracker \"Sync\" engine) cached."),
      fuse_request_timeout_s: int(60, "Kernel FUSE request timeout in seconds (protocol 7.43+); a hung server's requests then fail\ninstead of blocking the VMM forever. 0 = none. A restarted daemon must be back within it.", { min: 0, max: 65535, unit: "s" }),
      ready_timeout_ms: int(10_000, "Longest wait (ms) for a started daemon to report ready.", { min: 1, max: MS_MAX, unit: "ms" }),
      stop_timeout_ms: int(5000, "Longest wait (ms) for the daemon to exit after a shutdown request before SIGTERM (and as long\nagain before SIGKILL).", { min: 1, max: MS_MAX, unit: "ms" }),
      max_restarts: int(5, "How many times a daemon that died is started again over one node's life. The node holds a copy\nof every FUSE connection, so the new daemon resumes them (FUSE_NOTIFY_RESEND) without guest errors.", { min: 0, unit: "count" }),
      request_timeout_ms: int(30_000, "Longest wait (ms) for the daemon's answer to one request.", { min: 1, max: MS_MAX, unit: "ms" }),
      max_frame_bytes: int(16_777_216, "Largest request/response frame on the daemon's socket, bytes (4-byte length + JSON).", { min: 4096, max: 1 << 30, unit: "bytes" }),
    },
  ),

  firecracker: section("", {
    binary: str("/usr/local/bin/firecracker", "Path of the firecracker executable (not packaged by Debian; install a release binary).", { minLength: 1 }),
    boot_args: str("console=ttyS0 reboot=k panic=1 pci=off", "Kernel command line the driver starts from; `ip=` (when the VM has a NIC) and the\nsandbox's own arguments are appended."),
    api_timeout_ms: int(30_000, "Longest wait (ms) for one API request on the Unix socket (snapshot create/load included).\n(Socket and stop timeouts: [vm] socket_timeout_ms and stop_timeout_ms.)", { min: 1, max: MS_MAX, unit: "ms" }),
    track_dirty_pages: bool(true, "KVM dirty-page tracking, needed for Diff snapshots (set at boot and again on snapshot load)."),
    mmds_version: oneOf(["V1", "V2"], "V2", 'MMDS version: "V1" or "V2" (token-based; V1 is deprecated).'),
    drive_cache_type: oneOf(["Unsafe", "Writeback"], "Writeback", 'Drive cache_type: "Unsafe" (no flush advertised) or "Writeback" (guest flush -> host fsync).'),
    drive_io_engine: oneOf(["Sync", "Async"], "Sync", 'Drive io_engine: "Sync" or "Async" (io_uring, developer preview).'),
    entropy_device: bool(true, "Attach a virtio-rng device (PUT /entropy): the guest's Bun-based envd needs entropy at boot."),
  }),

  network: section(
    "Sandbox networks (src/net).",
    {
      name_prefix: str(
        "aenv-",
        "Prefix of every netns (<prefix><idx> in /run/netns), host veth and\nnode iptables chain (<prefix>fwd, <prefix>in, <prefix>post) the node creates; start-up reaping\ndeletes exactly the objects named <prefix><digits> and the chains starting with it.\n[a-z][a-z0-9-]{0,9}; prefix + largest index must fit the 15-byte interface name limit.\nSeveral nodes on one host: each needs its own prefix, none a prefix of another's (aenva-/aenvb-),\nor a node's start-up reaping destroys the other node's sandbox networks (see src/net/index.ts).",
        { pattern: "^[a-z][a-z0-9-]{0,9}$" },
      ),
      max_slots: int(1024, "Bound on slots (warm + allocated + being built); also bounded by the two address ranges.", { min: 1, max: 32768, unit: "count" }),
      command_timeout_ms: int(10_000, "Time limit of one ip / iptables-restore invocation, ms.", { min: 100, max: 600_000, unit: "ms" }),
      enable_ip_forward: bool(true, "Set net.ipv4.ip_forward=1 in the node's network namespace at start (needed to route slots)."),

      internal: section(
        "Address ranges of the slots. They must not overlap each other or the VM tap link\n169.254.0.20/30 (guest .21, gateway .22 inside every slot netns).",
        {
          host_interaction_cidr: str("10.11.0.0/16", "One address per slot: the node reaches guest port P at <base + 1 + idx>:P (DNAT in the netns)."),
          veth_cidr: str("10.12.0.0/16", "Two addresses (/31) per slot: host veth end <base + 2*idx>, netns end <base + 2*idx + 1>; slot\ntraffic leaves the netns with the netns end as source and is masqueraded by the node."),
        },
      ),

      egress: section("", {
        always_denied_cidrs: list(
          ["10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16"],
          "Destinations denied after a sandbox's allowOut rules and before its denyOut rules, so only an\nexplicit allowOut entry opens them: RFC 1918, CGNAT, loopback, link-local.",
        ),
        default_action: oneOf(
          ["allow", "deny"],
          "allow",
          'Egress that no rule matched, for a sandbox with internet access: "allow" (E2B behaviour) or\n"deny" (only allowOut entries get out). allow_internet_access=false always denies it.',
        ),
        dns_proxy_enabled: bool(
          true,
          "Redirect the guests' port 53 (UDP and TCP) to the node's DNS proxy, which admits the A records of names\nmatching allowOut domain patterns (\"*.example.com\") before relaying the answer.",
        ),
        dns_proxy_port: int(10053, "UDP and TCP port of the DNS proxy on the node (all addresses; node INPUT rules admit it from slots only).\n0: any free port (the rules name the bound one), e.g. for several nodes on one host.", { min: 0, max: 65535 }),
        dns_upstream: list([], 'Upstream resolvers, "ip" or "ip:port". Empty: the nameservers of /etc/resolv.conf.'),
        dns_timeout_ms: int(2000, "Wait for an upstream answer, ms; then the guest gets SERVFAIL.", { min: 10, max: 60_000, unit: "ms" }),
        dns_max_inflight: int(1024, "Bound on queries waiting for upstream at once; more get SERVFAIL.", { min: 1, max: 65536, unit: "count" }),
        dns_max_addresses_per_slot: int(256, "Bound on DNS-learned addresses per slot; the least recently refreshed are dropped first.", { min: 1, max: 65536, unit: "count" }),
        dns_min_ttl_secs: int(60, "Floor on how long a learned address stays admitted, seconds (answers' TTLs below it are raised).", { min: 0, max: 86_400, unit: "s" }),
        interceptor_enabled: bool(
          true,
          "The egress interceptor (docs/security.md): sandboxes' network.rules (headers set on outbound\nHTTPS per host, secrets resolved on the node) and network.egressProxy. Guests trust the node's\negress CA (sent with every envd /init). false: both are refused with 400.",
        ),
        interceptor_port: int(10443, "TCP port of the egress interceptor on the node (all addresses; node INPUT rules admit only\nredirected slot traffic). 0: any free port, e.g. for several nodes on one host.", { min: 0, max: 65535 }),
        intercept_ports: list([], "Ports besides 443 whose TLS is looked at for network.rules hosts (e.g. \"8443\"); at most 14."),
        upstream_ca_path: str("", "PEM file of CA certificates trusted for upstream servers of intercepted requests, besides the\nhost's roots (private services, tests). Empty: the host's roots only."),
        ca_dir: str("", "Directory of the node's egress CA (ca.crt, ca.key mode 0600), made on first start. Empty:\n$home_path/egress-ca."),
        client_hello_timeout_ms: int(10_000, "Wait for a TLS ClientHello on an intercepted port before the connection is passed through untouched, ms.", { min: 10, max: 600_000, unit: "ms" }),
        upstream_connect_timeout_ms: int(10_000, "Bound on connecting upstream from the interceptor (and the egress proxy's handshake, and TLS), ms.", { min: 10, max: 600_000, unit: "ms" }),
        interceptor_max_connections: int(4096, "Most guest connections the interceptor handles at once; more are reset.", { min: 1, max: 1_048_576, unit: "count" }),
        max_request_head_bytes: int(65_536, "Largest HTTP request head of an intercepted request; larger ones are answered 431.", { min: 1024, max: 16_777_216, unit: "bytes" }),
        max_rule_domains: int(10, "Most domains one sandbox's network.rules may name (E2B: 10).", { min: 1, max: 1024, unit: "count" }),
      }),
    },
  ),

  pool: section(
    "Warm network slots: the pool starts at the low watermark and its refill target grows by one per\npool miss up to the high watermark; slots released above the high watermark are drained.\nLow must not exceed high; high must not exceed network.max_slots.",
    {
      low_watermark: int(2, "", { min: 0, max: 32768, unit: "count" }),
      high_watermark: int(64, "", { min: 0, max: 32768, unit: "count" }),

      block: section(
        "Warm pool of pre-created disk exports in the disk daemon (FUSE: a mounted, initialised\nconnection waiting for its image; ublk: a device added (ADD_DEV) with its queue threads started\nand waiting, which a bind gives its size (SET_PARAMS) and starts (START_DEV)). An exclusive\nacquire takes one and binds the sandbox's disk to it; the daemon refills in the background up to\nhigh_watermark once fewer than low_watermark are left. The pool starts filled to low_watermark.",
        {
          enabled: bool(true, "Keep pre-created disk exports."),
          low_watermark: int(1, "", { min: 0, max: 1024, unit: "count" }),
          high_watermark: int(2, "", { min: 0, max: 1024, unit: "count" }),
        },
      ),

      restore: section(
        "Restore pool (issue 9 item 7): sandboxes of a snapshot restored ahead of requests, their envd\ninitialised and one command of the SDK's kind run (under TCG that makes the code paths of a\ncreate's first requests), then paused, so a create of that snapshot adopts one: its egress policy\nset, the VM continued, envd re-initialised with the create's token, env vars, clock and host name.\nPer pooled snapshot: below low_watermark ready VMs, VMs are made one at a time up to\nhigh_watermark; only the `snapshots` snapshots most recently created from are pooled (template\nand user snapshots of the VM shape a create asks for, without volumes). A pooled VM holds a\nnetwork slot, its disk upper and about 80 MiB of host memory; it is not a sandbox (max_sandboxes\ndoes not count it). high_watermark = 0: no pool.",
        {
          low_watermark: int(1, "", { min: 0, max: 64, unit: "count" }),
          high_watermark: int(2, "", { min: 0, max: 64, unit: "count" }),
          snapshots: int(1, "Snapshots pooled at once (the most recently created from); the others lose their VMs.", { min: 1, max: 16, unit: "count" }),
          fill_delay_ms: int(1000, "Quiet time after the node's last sandbox start before the pool makes a VM (a fill competes for\nCPU with what a fresh sandbox runs first), ms.", { min: 0, max: MS_MAX, unit: "ms" }),
          retry_backoff_ms: int(5000, "Wait after a failed fill before the next one, ms.", { min: 1, max: MS_MAX, unit: "ms" }),
        },
      ),

      network: section("", {
        maintenance_enabled: bool(
          true,
          "Keep the network-slot pool between the watermarks with one background worker. Off: the pool is\nfilled to the low watermark at start only, and releases above high are destroyed at once.",
        ),
        retry_backoff_ms: int(1000, "Wait after a failed background slot build before the worker retries, ms.", { min: 1, max: 600_000, unit: "ms" }),
      }),
    },
  ),

  secrets: section("Customer secrets (/secrets; docs/security.md): values encrypted in the node database, resolved by the egress interceptor.", {
    key_path: str("", "File of the key values are encrypted with (32 random bytes as hex), made with mode 0600 on\nfirst start; kept out of the database (and its backups). Empty: $home_path/secrets.key.\nWith store = \"redis\" the file must exist (every gateway replica needs the same key; the\nKubernetes manifests mount it from the Secret agentenv-secrets-key)."),
    store: oneOf(["file", "redis"], "file", 'Where the gateway keeps the cluster\'s secrets: "file" ($home_path/gateway-secrets.db; one gateway\nwith a persistent data directory) or "redis" (redis_url; every gateway replica shares them,\nvalues sealed with key_path\'s key before they reach Redis). Nodes keep theirs in their database.'),
    redis_url: str("", 'Redis server of store = "redis" (redis://[user:password@]host:port[/db]). Empty: [scheduler] redis_url\n(one Redis per cluster).'),
    redis_prefix: str("agentenv:secrets:", "Prefix of every Redis key the secrets store writes."),
    redis_connect_timeout_ms: int(3000, "Bound on connecting to the Redis server, ms; a /secrets call then fails 503 secrets.store_failed.", { min: 1, max: MS_MAX, unit: "ms" }),
    max_secrets: int(1000, "Most secrets the store holds; more creates are refused with 409.", { min: 1, max: 1_000_000, unit: "count" }),
    gateway_url: str("", "Cluster nodes: URL of the gateway that keeps the cluster's secrets; the interceptor asks it for a\nvalue at each request (with this node's API key) and /secrets here answers 403. Empty: this node's store."),
    resolve_timeout_ms: int(5000, "Bound on one look-up of a secret at the gateway, ms.", { min: 10, max: 600_000, unit: "ms" }),
  }),

  envd: ENVD_SECTION,

  overlaybd: section("", {
    cache_size_bytes: int(268_435_456, "Block cache in front of remote (registry) layers: total bytes kept in memory (LRU).", { min: 0, max: TIB, unit: "bytes" }),
    cache_block_size: oneOf(
      [4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576, 2097152, 4194304],
      262144,
      "Block cache unit, bytes (a power of two, 4096..4194304); misses fetch whole blocks of this size.",
    ),
    zfile_algo: oneOf(["zstd", "lz4"], "zstd", 'Default ZFile algorithm for new compressed layers: "zstd" (level 3) or "lz4".'),
    zfile_block_size: oneOf([4096, 8192, 16384, 32768, 65536], 4096, "ZFile block size, bytes: 4096, 8192, 16384, 32768 or 65536 (overlaybd reads 4096 best)."),
    registry_retries: int(3, "Registry range requests: attempts per read before failing.", { min: 1, max: 100, unit: "count" }),
    registry_timeout_ms: int(30_000, "Registry request timeout, ms.", { min: 1, max: MS_MAX, unit: "ms" }),
    registry_token_ttl_ms: int(30_000, "How long a registry bearer token is reused when the server states no expiry, ms.", { min: 0, max: MS_MAX, unit: "ms" }),
  }),

  ublk: section("ublk block devices (src/storage/ublk/): overlaybd stacks and CoW files served as /dev/ublkbN\nthrough io_uring, one worker thread per queue. Needs /dev/ublk-control (CONFIG_BLK_DEV_UBLK).", {
    queues: int(1, "Queues per device, each one io_uring + one worker thread (the kernel clamps to the CPUs).", { min: 1, max: 16, unit: "count" }),
    queue_depth: int(64, "Requests in flight per queue. Each holds a buffer of max_io_bytes.", { min: 1, max: 4096, unit: "count" }),
    max_io_bytes: int(524_288, "Largest request payload in bytes.", { min: 4096, max: 16_777_216, multipleOf: 4096, unit: "bytes" }),
    logical_block_shift: int(9, "log2 of the logical block size in bytes (9 = 512 B).", { min: 9, max: 12, unit: "count" }),
    physical_block_shift: int(12, "log2 of the physical block size in bytes (12 = 4 KiB); at least logical_block_shift.", { min: 9, max: 12, unit: "count" }),
    user_recovery: bool(true, "Ask for user recovery (USER_RECOVERY + REISSUE) where the kernel offers it: when the serving\nprocess dies, the device stays, requests wait, and a new process resumes it; false: the kernel\nremoves the device when its server dies."),
    control_timeout_ms: int(30_000, "Longest wait (ms) for one control command (START_DEV waits for every queue to be ready).", { min: 1, max: MS_MAX, unit: "ms" }),
    recovery_wait_ms: int(30_000, "Longest wait (ms) for the device of a dead server to become recoverable (the kernel notices a\ndead server within about 5 s) and for its old server's files to be released.", { min: 1, max: MS_MAX, unit: "ms" }),
    cow_chunk_bytes: oneOf([4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576, 2097152, 4194304], 65536, "Copy-on-write unit of a CoW file over a read-only origin, bytes (a power of two, 4096..4194304)."),
  }),
});

/** The loaded, validated node configuration (keys as in config/default.toml). */
export type Config = Static<typeof CONFIG_SCHEMA>;
