// A button that asks once more, in a small modal dialog (no browser confirm()), before a
// destructive or visible change. The dialog behaves like one for keyboard users: focus starts on
// the confirming button, Tab and Shift+Tab cycle inside it, Escape or a click on the backdrop
// dismisses it, and focus goes back to the button that opened it.
import { type KeyboardEvent, useEffect, useId, useRef, useState } from "react";

interface Props {
  label: string;
  question: string;
  confirmLabel?: string;
  dismissLabel?: string;
  onConfirm: () => void;
  disabled?: boolean;
  danger?: boolean;
}

export function ConfirmButton({
  label,
  question,
  confirmLabel = "Confirm",
  dismissLabel = "Cancel",
  onConfirm,
  disabled,
  danger,
}: Props) {
  const [asking, setAsking] = useState(false);
  const trigger = useRef<HTMLButtonElement>(null);
  const returnFocus = useRef(false);
  useEffect(() => {
    if (!asking && returnFocus.current) {
      returnFocus.current = false;
      trigger.current?.focus();
    }
  }, [asking]);
  const close = () => {
    returnFocus.current = true;
    setAsking(false);
  };

  if (!asking) {
    return (
      <button
        type="button"
        ref={trigger}
        className={danger ? "danger" : undefined}
        disabled={disabled}
        aria-haspopup="dialog"
        onClick={() => setAsking(true)}
      >
        {label}
      </button>
    );
  }
  return (
    <ConfirmDialog
      question={question}
      confirmLabel={confirmLabel}
      dismissLabel={dismissLabel}
      danger={danger}
      onConfirm={() => {
        close();
        onConfirm();
      }}
      onDismiss={close}
    />
  );
}

interface DialogProps {
  question: string;
  confirmLabel: string;
  dismissLabel: string;
  danger?: boolean;
  onConfirm: () => void;
  onDismiss: () => void;
}

function ConfirmDialog({ question, confirmLabel, dismissLabel, danger, onConfirm, onDismiss }: DialogProps) {
  const box = useRef<HTMLDivElement>(null);
  const questionId = useId();
  const onKeyDown = (event: KeyboardEvent) => {
    if (event.key === "Escape") {
      event.stopPropagation();
      onDismiss();
      return;
    }
    if (event.key !== "Tab") return;
    // Keep Tab inside the dialog: from the last button to the first, and back with Shift.
    const buttons = [...box.current!.querySelectorAll<HTMLButtonElement>("button")];
    const at = buttons.indexOf(document.activeElement as HTMLButtonElement);
    const next = (at + (event.shiftKey ? -1 : 1) + buttons.length) % buttons.length;
    event.preventDefault();
    buttons[next].focus();
  };
  return (
    <div className="backdrop" onClick={onDismiss}>
      <div
        ref={box}
        className="dialog"
        role="alertdialog"
        aria-modal="true"
        aria-label={question}
        aria-describedby={questionId}
        onKeyDown={onKeyDown}
        onClick={(event) => event.stopPropagation()}
      >
        <p id={questionId}>{question}</p>
        <div className="row">
          <button type="button" className={danger ? "danger" : "primary"} autoFocus onClick={onConfirm}>
            {confirmLabel}
          </button>
          <button type="button" onClick={onDismiss}>{dismissLabel}</button>
        </div>
      </div>
    </div>
  );
}
