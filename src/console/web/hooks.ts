/** Small hooks the pages share: polling, the hash route. */
import { useEffect, useRef, useState } from "preact/hooks";
import { asError } from "../../util/error.ts";

/**
 * Run `load` now and every `ms` while the component is mounted (the next run starts `ms` after
 * the previous one ended, so a slow API never piles requests up). `deps` restart it.
 * @returns the last value, the last error, and `reload()` for a refresh right away.
 */
export function usePoll<T>(load: () => Promise<T>, ms: number, deps: unknown[] = []): { value: T | undefined; error: Error | null; reload: () => void } {
  const [value, setValue] = useState<T | undefined>(undefined);
  const [error, setError] = useState<Error | null>(null);
  const kick = useRef<() => void>(() => {});
  useEffect(() => {
    let stopped = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const run = async () => {
      clearTimeout(timer);
      try {
        const v = await load();
        if (stopped) return;
        setValue(() => v);
        setError(null);
      } catch (e) {
        if (!stopped) setError(asError(e));
      }
      if (!stopped) timer = setTimeout(run, ms);
    };
    kick.current = () => void run();
    void run();
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }, deps);
  return { value, error, reload: () => kick.current() };
}

/** The path after `#` (e.g. `/sandboxes/abc`), updated on navigation. */
export function useHashPath(): string {
  const read = () => decodeURI(location.hash.replace(/^#/, "")) || "/sandboxes";
  const [path, setPath] = useState(read);
  useEffect(() => {
    const on = () => setPath(read());
    window.addEventListener("hashchange", on);
    return () => window.removeEventListener("hashchange", on);
  }, []);
  return path;
}
