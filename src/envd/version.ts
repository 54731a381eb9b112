/**
 * The envd protocol version this daemon implements, reported in `X-Envd-Version` and meant
 * for the API's `envdVersion` field. The SDKs gate features on it (docs/e2b-contract.md §5.4);
 * everything up to 0.6.4 is implemented: stdin flag, no implicit user header, closeStdin,
 * octet-stream uploads, file metadata as `user.e2b.*` xattrs (0.6.2), `includeEntry` in watch
 * events (0.6.3), `allowNetworkMounts` for watches (0.6.4).
 */
export const ENVD_VERSION = "0.6.4";

/** The port envd listens on in every guest (E2B's envd port; e2b-contract.md §3). */
export const ENVD_PORT = 49983;
