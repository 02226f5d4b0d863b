// Loading, empty and error states, the same on every page.
import { ApiError } from "../api/client";

export function Loading({ what = "Loading" }: { what?: string }) {
  return <p className="muted" role="status" aria-live="polite">{what}…</p>;
}

export function Empty({ children }: { children: React.ReactNode }) {
  return <p className="empty">{children}</p>;
}

/** The server's own message for a failed call (status and parameter included); never a generic text. */
export function ErrorBox({ error, title }: { error: unknown; title?: string }) {
  if (!error) return null;
  const message = error instanceof Error ? error.message : String(error);
  const prefix = error instanceof ApiError && error.status > 0 ? `${error.status}` : "";
  return (
    <div className="error" role="alert">
      {title && <strong>{title}: </strong>}
      {prefix && <span className="status">{prefix} </span>}
      <span className="message">{message}</span>
    </div>
  );
}
