/**
 * The envd protocol version this daemon implements, reported in `X-Envd-Version` and meant
 * for the API's `envdVersion` field. The SDKs gate features on it (docs/e2b-contract.md §5.4):
 * 0.5.7 = stdin flag, no implicit user header, closeStdin, octet-stream uploads. Not yet 0.6.2:
 * file metadata (xattrs) is not implemented.
 */
export const ENVD_VERSION = "0.5.7";
