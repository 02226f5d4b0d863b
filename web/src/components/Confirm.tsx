// A button that asks once more, inline (no browser dialog), before a destructive or visible change.
import { useState } from "react";

interface Props {
  label: string;
  question: string;
  confirmLabel?: string;
  onConfirm: () => void;
  disabled?: boolean;
  danger?: boolean;
}

export function ConfirmButton({ label, question, confirmLabel = "Confirm", onConfirm, disabled, danger }: Props) {
  const [asking, setAsking] = useState(false);
  if (!asking) {
    return (
      <button type="button" className={danger ? "danger" : undefined} disabled={disabled} onClick={() => setAsking(true)}>
        {label}
      </button>
    );
  }
  return (
    <span className="confirm" role="group" aria-label={question}>
      <span>{question}</span>
      <button
        type="button"
        className={danger ? "danger" : "primary"}
        autoFocus
        onClick={() => {
          setAsking(false);
          onConfirm();
        }}
      >
        {confirmLabel}
      </button>
      <button type="button" onClick={() => setAsking(false)}>Cancel</button>
    </span>
  );
}
