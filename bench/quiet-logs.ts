/**
 * Imported first by benches that start a node, gateway or scheduler in their own process: the
 * process logger (src/observability/log.ts) takes its level from the environment variable
 * AENV_LOG_LEVEL once, when it is first imported, and the loggers of each module are made from it
 * then. `AENV_LOG_LEVEL` handed to loadConfig (or startNodeNoVm's env) only sets the config's
 * `log.level`, which an in-process node never applies (the CLI commands do), so a bench passing it
 * there still printed the node's warnings between its figures. Set here, before anything imports
 * the logger; a level given in the bench's own environment wins.
 */
process.env.AENV_LOG_LEVEL ??= "error";
