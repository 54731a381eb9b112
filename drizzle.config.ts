// drizzle-kit settings: `bunx drizzle-kit generate --name <what>` writes SQL into src/db/migrations;
// then add the new file to src/db/migrations/index.ts (that list is what the binary embeds).
export default {
  dialect: "sqlite",
  schema: "./src/db/schema/*.ts",
  out: "./src/db/migrations",
};
