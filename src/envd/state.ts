/**
 * Sandbox-wide envd settings installed by `POST /init` (docs/e2b-contract.md §3.2): access token,
 * env vars for every process, default user and working directory, last applied timestamp.
 */

/** Plain data form of the /init body, already validated. */
export interface InitRequest {
  accessToken?: string;
  envVars?: Record<string, string>;
  /** RFC 3339 host time; older than the last applied one => the request is ignored. */
  timestamp?: string;
  defaultUser?: string;
  defaultWorkdir?: string;
  /** PEM certificates to add to the trust store. */
  caBundle?: string;
  /** Guest host name (AgentENV extension; applied in guests only). */
  hostname?: string;
  /** Base64 host random bytes for the kernel's generator (AgentENV extension; guests only). */
  entropy?: string;
}

/** Mutable settings shared by every handler of one envd instance. */
export class EnvdState {
  accessToken: string | undefined;
  envVars: Record<string, string> = {};
  defaultUser: string;
  defaultWorkdir: string | undefined;
  /** ms since epoch of the newest /init timestamp applied. */
  lastInitMs = 0;
  /**
   * Trust-store variables of an installed caBundle (NODE_EXTRA_CA_CERTS, ...), under every
   * process's env vars; empty until an /init brings one.
   */
  trustEnv: Record<string, string> = {};
  /** Kernel random reseeds this envd process made from /init entropy (one per restore it was initialised after). */
  reseeds = 0;

  /**
   * Check the acting user's rights on file operations (403 / permission_denied). Off = E2B's
   * behaviour: envd, as root, does what is asked and the user owns what gets created.
   */
  readonly enforcePermissions: boolean;

  constructor(opts: { defaultUser?: string; accessToken?: string; enforcePermissions?: boolean } = {}) {
    this.defaultUser = opts.defaultUser ?? "root";
    this.accessToken = opts.accessToken || undefined;
    this.enforcePermissions = opts.enforcePermissions ?? false;
  }

  /**
   * Apply an /init body. Returns false (nothing changed) when its timestamp is older than the
   * last applied one, as E2B's envd does.
   */
  apply(req: InitRequest): boolean {
    if (req.timestamp) {
      const ms = Date.parse(req.timestamp);
      if (Number.isFinite(ms)) {
        if (ms < this.lastInitMs) return false;
        this.lastInitMs = ms;
      }
    }
    if (req.accessToken !== undefined) this.accessToken = req.accessToken || undefined;
    if (req.envVars !== undefined) this.envVars = { ...req.envVars };
    if (req.defaultUser) this.defaultUser = req.defaultUser;
    if (req.defaultWorkdir !== undefined) this.defaultWorkdir = req.defaultWorkdir || undefined;
    return true;
  }
}
