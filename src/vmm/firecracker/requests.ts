/**
 * Pure builders of the API request sequences the driver sends (bodies per
 * ../shared/contracts/firecracker-api.yaml, v1.16 semantics: ../shared/docs/ublk-iouring-firecracker.md §3.2).
 */
import { kernelIpArg } from "../bootargs.ts";
import { VmmError } from "../errors.ts";
import type { SnapshotFiles, VmSpec } from "../types.ts";
import type { ApiRequest } from "./api.ts";
import type { FirecrackerConfig } from "./config.ts";

/** Interface id of the single guest NIC. */
export const IFACE_ID = "eth0";
/** Firecracker's --id: alphanumerics and '-', at most 64 characters. */
const FC_ID = /^[A-Za-z0-9-]{1,64}$/;
const DRIVE_ID = /^[A-Za-z0-9_]{1,64}$/;
const MAC = /^([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}$/;

/**
 * Check a spec against what Firecracker accepts.
 * @throws VmmError `vmm.bad_spec` naming the field
 */
export function validateSpec(spec: VmSpec): void {
  const bad = (field: string, value: unknown, why: string) =>
    new VmmError("vmm.bad_spec", `vm ${spec.id}: ${field} ${why}`, { id: spec.id, field, value: value ?? null });
  if (!FC_ID.test(spec.id)) throw bad("id", spec.id, "must be 1..64 of [A-Za-z0-9-]");
  if (!spec.workDir.startsWith("/")) throw bad("workDir", spec.workDir, "must be absolute");
  if (!spec.kernelPath.startsWith("/")) throw bad("kernelPath", spec.kernelPath, "must be absolute");
  if (!Number.isInteger(spec.vcpus) || spec.vcpus < 1 || spec.vcpus > 32) throw bad("vcpus", spec.vcpus, "must be 1..32");
  if (!Number.isInteger(spec.memoryMiB) || spec.memoryMiB < 1) throw bad("memoryMiB", spec.memoryMiB, "must be a positive integer");
  const ids = new Set<string>();
  for (const d of spec.drives) {
    if (!DRIVE_ID.test(d.id)) throw bad("drives.id", d.id, "must be 1..64 of [A-Za-z0-9_]");
    if (ids.has(d.id)) throw bad("drives.id", d.id, "is duplicated");
    ids.add(d.id);
    if (!d.path.startsWith("/")) throw bad("drives.path", d.path, "must be absolute");
  }
  if (spec.drives.filter((d) => d.isRoot).length > 1) throw bad("drives", spec.drives.map((d) => d.id), "has more than one root drive");
  if (spec.net && !MAC.test(spec.net.mac)) throw bad("net.mac", spec.net.mac, "is not a MAC address");
  if (spec.metadata !== undefined && !spec.net) throw bad("metadata", null, "needs a network interface (MMDS is reached through it)");
}

/** Full kernel command line: config base, `ip=` when networked, then the spec's own args. */
export function bootArgs(spec: VmSpec, cfg: FirecrackerConfig): string {
  return [cfg.bootArgs, spec.net ? kernelIpArg(spec.net) : "", spec.bootArgs].filter((s) => s.trim()).join(" ");
}

/** Requests that configure and start a fresh process, in order. */
export function bootRequests(spec: VmSpec, cfg: FirecrackerConfig): ApiRequest[] {
  validateSpec(spec);
  const reqs: ApiRequest[] = [
    {
      method: "PUT", path: "/machine-config",
      body: { vcpu_count: spec.vcpus, mem_size_mib: spec.memoryMiB, smt: false, track_dirty_pages: cfg.trackDirtyPages },
    },
    { method: "PUT", path: "/boot-source", body: { kernel_image_path: spec.kernelPath, boot_args: bootArgs(spec, cfg) } },
  ];
  // root drive first: Firecracker names drives in PUT order (vda, vdb, ...)
  const drives = [...spec.drives].sort((a, b) => Number(b.isRoot) - Number(a.isRoot));
  for (const d of drives) {
    reqs.push({
      method: "PUT", path: `/drives/${d.id}`,
      body: {
        drive_id: d.id, path_on_host: d.path, is_root_device: d.isRoot, is_read_only: d.readOnly,
        cache_type: cfg.driveCacheType, io_engine: cfg.driveIoEngine,
      },
    });
  }
  if (spec.net) {
    reqs.push({
      method: "PUT", path: `/network-interfaces/${IFACE_ID}`,
      body: { iface_id: IFACE_ID, host_dev_name: spec.net.tapName, guest_mac: spec.net.mac },
    });
    if (spec.metadata !== undefined) {
      reqs.push({ method: "PUT", path: "/mmds/config", body: { version: cfg.mmdsVersion, network_interfaces: [IFACE_ID] } });
      reqs.push({ method: "PUT", path: "/mmds", body: spec.metadata });
    }
  }
  // virtio-rng: a Bun envd in the guest needs entropy early (../shared/docs/bun-in-guest.md)
  if (cfg.entropyDevice) reqs.push({ method: "PUT", path: "/entropy", body: {} });
  reqs.push({ method: "PUT", path: "/actions", body: { action_type: "InstanceStart" } });
  return reqs;
}

/** PATCH /drives/{drive_id} (post-boot) with the drive's path: Firecracker re-opens it and updates the guest's capacity. */
export function patchDriveRequest(drive: { id: string; path: string }): ApiRequest {
  return { method: "PATCH", path: `/drives/${drive.id}`, body: { drive_id: drive.id, path_on_host: drive.path } };
}

/** PATCH /vm to Paused or Resumed. */
export function vmStateRequest(state: "Paused" | "Resumed"): ApiRequest {
  return { method: "PATCH", path: "/vm", body: { state } };
}

/** PUT /snapshot/create for a paused VM. */
export function snapshotCreateRequest(files: SnapshotFiles): ApiRequest {
  return {
    method: "PUT", path: "/snapshot/create",
    body: { snapshot_type: files.kind === "diff" ? "Diff" : "Full", snapshot_path: files.statePath, mem_file_path: files.memPath },
  };
}

/**
 * Requests that restore a fresh process from snapshot files (memory mapped privately from a
 * File backend), then re-PUT the MMDS data store, which snapshots do not carry.
 * VMGenID needs no request: Firecracker ≥ 1.8 on x86_64 always puts the device in the guest's
 * ACPI tables and gives it a new id on every snapshot load (the API spec has no setting for it);
 * a guest kernel with CONFIG_VMGENID (src/vmm/kernel/guest.config) reseeds its generator then.
 * The node also reseeds it through envd's /init (docs/security.md).
 */
export function restoreRequests(spec: VmSpec, files: SnapshotFiles, resume: boolean, cfg: FirecrackerConfig): ApiRequest[] {
  validateSpec(spec);
  const body: Record<string, unknown> = {
    snapshot_path: files.statePath,
    mem_backend: { backend_type: "File", backend_path: files.memPath },
    track_dirty_pages: cfg.trackDirtyPages,
    resume_vm: resume,
  };
  if (spec.net) body.network_overrides = [{ iface_id: IFACE_ID, host_dev_name: spec.net.tapName }];
  const reqs: ApiRequest[] = [{ method: "PUT", path: "/snapshot/load", body }];
  if (spec.metadata !== undefined) reqs.push({ method: "PUT", path: "/mmds", body: spec.metadata });
  return reqs;
}
