import { type FormEvent, useState } from "react";
import { ErrorBox } from "../components/States";

interface Props {
  onKey: (key: string) => void;
  error: Error | null;
  checking: boolean;
}

export function SignInPage({ onKey, error, checking }: Props) {
  const [key, setKey] = useState("");
  const submit = (event: FormEvent) => {
    event.preventDefault();
    if (key.trim()) onKey(key.trim());
  };
  return (
    <main className="signin" id="main">
      <h1>loraloom console</h1>
      <form onSubmit={submit} aria-label="Sign in">
        <label htmlFor="api-key">API key</label>
        <input
          id="api-key"
          type="password"
          autoComplete="off"
          autoFocus
          value={key}
          onChange={(event) => setKey(event.target.value)}
          placeholder="ll-…"
        />
        <button type="submit" className="primary" disabled={checking || !key.trim()}>
          {checking ? "Checking…" : "Sign in"}
        </button>
        <p className="muted">
          The key stays in this browser tab's session storage until you sign out. Make one with{" "}
          <code>loraloom admin create-key</code>.
        </p>
        <ErrorBox error={error} title="Sign-in failed" />
      </form>
    </main>
  );
}
