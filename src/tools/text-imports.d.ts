/** Text files embedded with `import x from "./f" with { type: "text" }` (Bun). */
declare module "*.sh" {
  const text: string;
  export default text;
}
