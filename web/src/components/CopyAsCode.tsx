// The playground's conversation as a curl command or a Python script (openai SDK): shown, and copied
// to the clipboard where the browser allows it (a page served over plain HTTP to another host does not).
import { useState } from "react";
import { type ChatCall, curlCommand, KEY_VARIABLE, pythonScript } from "../lib/copyAs";

type Language = "curl" | "python";

export function CopyAsCode({ call }: { call: ChatCall }) {
  const [shown, setShown] = useState<Language | null>(null);
  const [copied, setCopied] = useState<string | null>(null);
  const code = shown === "curl" ? curlCommand(call) : shown === "python" ? pythonScript(call) : "";
  const show = (language: Language) => {
    setShown(language);
    const text = language === "curl" ? curlCommand(call) : pythonScript(call);
    setCopied(null);
    navigator.clipboard?.writeText(text).then(
      () => setCopied("Copied to the clipboard."),
      () => setCopied("The browser refused the clipboard: select the code below and copy it."),
    );
  };
  return (
    <section aria-label="Copy as code">
      <div className="row">
        <button type="button" onClick={() => show("curl")}>Copy as curl</button>
        <button type="button" onClick={() => show("python")}>Copy as Python</button>
        {copied && <span className="muted" role="status">{copied}</span>}
      </div>
      {shown && (
        <>
          <p className="muted">
            The conversation so far{call.messages.at(-1)?.role === "user" ? " and the prompt being written" : ""}; set{" "}
            <code>{KEY_VARIABLE}</code> to your API key first.
          </p>
          <pre className="code" data-testid="copied-code" aria-label={shown === "curl" ? "curl command" : "Python script"}>{code}</pre>
        </>
      )}
    </section>
  );
}
