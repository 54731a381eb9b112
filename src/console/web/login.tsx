/** The key prompt: the key is checked against the API, then kept for this tab only. */
import { useState } from "preact/hooks";
import { login } from "./api.ts";
import { errorMessage } from "../../util/error.ts";

export function Login({ onLogin }: { onLogin: () => void }) {
  const [key, setKey] = useState("");
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const submit = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    try {
      const why = await login(key.trim());
      if (why === null) onLogin();
      else setError(`Key refused: ${why}`);
    } catch (err) {
      setError(`Cannot reach the API: ${errorMessage(err)}`);
    } finally {
      setBusy(false);
    }
  };
  return (
    <form class="login" onSubmit={submit}>
      <h1>AgentENV console</h1>
      <p>
        The API key of this node (or gateway): <code>$home_path/api-key</code>, or the <code>AENV_API_KEY</code> it was started with. It is kept in this tab only.
      </p>
      <input id="api-key" type="password" autocomplete="off" placeholder="e2b_..." value={key} onInput={(e) => setKey((e.target as HTMLInputElement).value)} />
      <button type="submit" disabled={busy || key.trim() === ""}>
        Log in
      </button>
      {error && (
        <p class="error" role="alert">
          {error}
        </p>
      )}
    </form>
  );
}
