// Where adapter files arrive: dropped (a PEFT directory, its files, or an archive) or picked with
// either of two file pickers (a directory, or files/an archive). It reports what arrived and the
// name of the dropped directory or archive; choosing which files to upload is the page's business.
import { type DragEvent, useState } from "react";
import { droppedFiles } from "../lib/dropped";

interface Props {
  onFiles: (files: File[], source: string) => void;
}

export function DropZone({ onFiles }: Props) {
  const [over, setOver] = useState(false);
  // dragenter and dragover must both be cancelled, or the browser opens the dropped file itself.
  const hover = (event: DragEvent) => {
    event.preventDefault();
    setOver(true);
  };
  const onDrop = async (event: DragEvent) => {
    event.preventDefault();
    setOver(false);
    const dropped = await droppedFiles(event.dataTransfer);
    onFiles(dropped.files, dropped.source);
  };
  const folderOf = (list: FileList) => list[0]?.webkitRelativePath.split("/")[0] || list[0]?.name || "";
  return (
    <div
      className={over ? "dropzone over" : "dropzone"}
      role="group"
      aria-label="Drop zone"
      onDragEnter={hover}
      onDragOver={hover}
      onDragLeave={() => setOver(false)}
      onDrop={onDrop}
      data-testid="dropzone"
    >
      <p>Drop a PEFT directory or an archive here, or choose:</p>
      <label className="button">
        Directory…
        <input
          type="file"
          className="visually-hidden"
          aria-label="Choose a directory"
          // @ts-expect-error: webkitdirectory is not in React's input attributes, but every browser has it
          webkitdirectory=""
          multiple
          onChange={(event) => event.target.files && onFiles([...event.target.files], folderOf(event.target.files))}
        />
      </label>
      <label className="button">
        Files or archive…
        <input
          type="file"
          className="visually-hidden"
          aria-label="Choose files or an archive"
          multiple
          accept=".json,.safetensors,.jinja,.gz,.tgz,.tar,.zip"
          onChange={(event) => event.target.files && onFiles([...event.target.files], event.target.files[0]?.name ?? "")}
        />
      </label>
    </div>
  );
}
