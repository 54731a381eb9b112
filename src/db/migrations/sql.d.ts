// Migration files are embedded as text (`import x from "./f.sql" with { type: "text" }`).
declare module "*.sql" {
  const text: string;
  export default text;
}
