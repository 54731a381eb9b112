/**
 * Client of Firecracker's HTTP/1.1 + JSON API on its Unix socket (`--api-sock`).
 * Facts: ../shared/contracts/firecracker-api.yaml; success is 204 (PUT/PATCH) or 200 with
 * JSON (GET); failure is 400/500 with `{"fault_message": "..."}`.
 */
import { Type as T } from "@sinclair/typebox";
import { VmmError } from "../errors.ts";
import { logger } from "../../observability/log.ts";
import { jsonSchema } from "../../util/json-check.ts";
import { readCapped } from "../../util/read-capped.ts";
import { errorMessage } from "../../util/error.ts";

const log = logger("vmm.firecracker");

/** Largest answer read from Firecracker's API, bytes (its answers are a few KiB of JSON). */
const ANSWER_BYTES = 1 << 20;

/** Firecracker's error answer. */
const FAULT = jsonSchema(T.Object({ fault_message: T.String() }));

/** One API request as the driver sends it (plain data; also what tests assert on). */
export interface ApiRequest {
  method: "GET" | "PUT" | "PATCH";
  path: string;
  body?: unknown;
}

/** An API client bound to one socket. */
export class FirecrackerApi {
  constructor(
    readonly socketPath: string,
    readonly vmId: string,
    private readonly timeoutMs: number,
  ) {}

  /**
   * Send one request; resolves with the parsed JSON body for 200, undefined for 204.
   * @throws VmmError `vmm.firecracker_api` (non-2xx; details.status, details.faultMessage),
   *   `vmm.firecracker_unreachable` (socket refused, timed out)
   */
  async send(req: ApiRequest): Promise<unknown> {
    let res: Response;
    try {
      res = await fetch(`http://localhost${req.path}`, {
        unix: this.socketPath,
        method: req.method,
        headers: req.body === undefined ? { Accept: "application/json" } : { "Content-Type": "application/json", Accept: "application/json" },
        body: req.body === undefined ? undefined : JSON.stringify(req.body),
        signal: AbortSignal.timeout(this.timeoutMs),
      } as RequestInit);
    } catch (e) {
      throw new VmmError("vmm.firecracker_unreachable", `firecracker API ${req.method} ${req.path} failed: ${errorMessage(e)}`, {
        id: this.vmId, socket: this.socketPath, method: req.method, path: req.path,
      }, { cause: e });
    }
    const body = await readCapped(res.body, ANSWER_BYTES);
    const text = new TextDecoder().decode(body.bytes);
    if (res.status === 204) return undefined;
    if (res.status === 200) {
      if (body.truncated) throw new VmmError("vmm.firecracker_api", `firecracker ${req.method} ${req.path}: answer over ${ANSWER_BYTES} bytes`, { id: this.vmId, method: req.method, path: req.path, status: res.status });
      if (!text) return undefined;
      try {
        return JSON.parse(text);
      } catch {
        throw new VmmError("vmm.firecracker_api", `firecracker ${req.method} ${req.path}: answer is not JSON`, { id: this.vmId, method: req.method, path: req.path, status: res.status });
      }
    }
    const fault = FAULT.parse(text);
    const faultMessage = fault.ok ? fault.value.fault_message : text;
    log.warn({ id: this.vmId, method: req.method, path: req.path, status: res.status, faultMessage }, "firecracker API error");
    throw new VmmError("vmm.firecracker_api", `firecracker ${req.method} ${req.path} → ${res.status}: ${faultMessage}`, {
      id: this.vmId, method: req.method, path: req.path, status: res.status, faultMessage, body: req.body ?? null,
    });
  }
}
