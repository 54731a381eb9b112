/**
 * envd's error type. Every failure carries a stable `code` (`envd.not_found`, ...) and a
 * `kind` that fixes both the Connect code and the HTTP status E2B's envd answers with
 * (docs/e2b-contract.md §4.1 code table, §3.3 /files errors).
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { AgentEnvError } from "../errors.ts";
import { errorCode, errorMessage } from "../util/error.ts";

/** Failure classes envd distinguishes on the wire. */
export type EnvdErrorKind =
  | "invalid_argument"
  | "not_found"
  | "already_exists"
  | "permission_denied"
  | "unauthenticated"
  | "failed_precondition"
  | "unimplemented"
  | "not_acceptable"
  | "resource_exhausted"
  | "insufficient_storage"
  | "unknown"
  | "internal";

const CONNECT_CODE: Record<EnvdErrorKind, Code> = {
  invalid_argument: Code.InvalidArgument,
  not_found: Code.NotFound,
  already_exists: Code.AlreadyExists,
  permission_denied: Code.PermissionDenied,
  unauthenticated: Code.Unauthenticated,
  failed_precondition: Code.FailedPrecondition,
  unimplemented: Code.Unimplemented,
  not_acceptable: Code.FailedPrecondition,
  resource_exhausted: Code.ResourceExhausted,
  // a full disk on an RPC (MakeDir, Move, a watcher's state): E2B's envd answers internal, and the
  // SDK maps resource_exhausted to RateLimitError ("try again later"), which a full disk is not
  insufficient_storage: Code.Internal,
  unknown: Code.Unknown,
  internal: Code.Internal,
};

/** HTTP status for the plain-HTTP routes (`/files`, `/init`, ...). */
const HTTP_STATUS: Record<EnvdErrorKind, number> = {
  invalid_argument: 400,
  not_found: 404,
  already_exists: 409,
  permission_denied: 403,
  unauthenticated: 401,
  failed_precondition: 400,
  unimplemented: 501,
  not_acceptable: 406,
  resource_exhausted: 429,
  insufficient_storage: 507,
  unknown: 500,
  internal: 500,
};

/** An EnvdError code: `envd.<kind>`. */
export type EnvdErrorCode = `envd.${EnvdErrorKind}`;

/** A typed envd failure; `details` names the offending path, pid, user, ... */
export class EnvdError extends AgentEnvError<EnvdErrorCode> {
  readonly kind: EnvdErrorKind;

  constructor(kind: EnvdErrorKind, message: string, details: Record<string, unknown> = {}, options?: ErrorOptions) {
    super(`envd.${kind}`, message, details, options);
    this.kind = kind;
  }

  /** The HTTP status E2B's envd uses for this kind on plain-HTTP routes. */
  get httpStatus(): number {
    return HTTP_STATUS[this.kind];
  }

  /** The same failure as a Connect error (its code decides the SDK's exception class). */
  toConnect(): ConnectError {
    return new ConnectError(this.message, CONNECT_CODE[this.kind], undefined, undefined, this);
  }
}

/**
 * Map a Node-style filesystem error (`ENOENT`, `EACCES`, ...) on `path` to an EnvdError.
 * Anything unrecognised becomes `internal`.
 */
export function fromFsError(err: unknown, path: string, op: string): EnvdError {
  if (err instanceof EnvdError) return err;
  const code = errorCode(err);
  const msg = errorMessage(err);
  const details = { path, op, errno: code };
  switch (code) {
    case "ENOENT":
      return new EnvdError("not_found", `${op}: path '${path}' does not exist`, details, { cause: err });
    case "EACCES":
    case "EPERM":
      return new EnvdError("permission_denied", `${op}: permission denied on '${path}'`, details, { cause: err });
    case "EEXIST":
      return new EnvdError("already_exists", `${op}: '${path}' already exists`, details, { cause: err });
    case "ENOTDIR":
    case "EISDIR":
    case "EINVAL":
    case "ENAMETOOLONG":
    case "ENOTEMPTY":
      return new EnvdError("invalid_argument", `${op}: ${msg}`, details, { cause: err });
    case "ENOSPC":
    case "EDQUOT":
      return new EnvdError("insufficient_storage", `${op}: not enough disk space for '${path}'`, details, { cause: err });
    default:
      return new EnvdError("internal", `${op}: ${msg}`, details, { cause: err });
  }
}

/** Convert anything thrown inside an RPC handler into the ConnectError the client should see. */
export function toConnectError(err: unknown): ConnectError {
  if (err instanceof ConnectError) return err;
  if (err instanceof EnvdError) return err.toConnect();
  return new ConnectError(errorMessage(err), Code.Internal);
}
