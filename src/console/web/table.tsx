/**
 * The pieces the list pages draw their tables with: `ListTable` (a `table.list` from columns and
 * rows), the state badge and the link to a sandbox's page. The processes tab keeps its own
 * markup: drawn by ListTable, its rows were replaced between polls, so a Kill button taken before
 * a poll was gone when clicked (test/console/console-vm.test.ts).
 */
import type { ComponentChildren } from "preact";

/** One column: its header and what a row shows in it; `class` of its cells (`mono`, `metric`, ...). */
export interface Column<R> {
  head: string;
  cell: (row: R) => ComponentChildren;
  class?: string;
}

/**
 * A `table.list` with id `id`: one header row of `columns`, then a row per item of `rows`, keyed
 * by `rowKey`; `rowData` gives a row's `data-*` attributes (`{ sandbox: id }` is `data-sandbox`),
 * by which pages and tests find it.
 */
export function ListTable<R>({ id, columns, rows, rowKey, rowData }: { id: string; columns: Column<R>[]; rows: R[]; rowKey: (row: R) => string | number; rowData?: (row: R) => Record<string, string> }) {
  return (
    <table class="list" id={id}>
      <thead>
        <tr>
          {columns.map((c) => (
            <th>{c.head}</th>
          ))}
        </tr>
      </thead>
      <tbody>
        {rows.map((r) => (
          <tr key={rowKey(r)} {...Object.fromEntries(Object.entries(rowData?.(r) ?? {}).map(([k, v]) => [`data-${k}`, v]))}>
            {columns.map((c) => (
              <td class={c.class}>{c.cell(r)}</td>
            ))}
          </tr>
        ))}
      </tbody>
    </table>
  );
}

/** A state (`running`, `ready`, `error`, ...) as the coloured badge the stylesheet gives `.state.<name>`. */
export function State({ value, id }: { value: string; id?: string }) {
  return (
    <span id={id} class={`state ${value}`}>
      {value}
    </span>
  );
}

/** A link to sandbox `id`'s page. */
export function SandboxLink({ id }: { id: string }) {
  return <a href={`#/sandboxes/${encodeURIComponent(id)}`}>{id}</a>;
}
