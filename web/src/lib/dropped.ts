// Files from a drop or a file picker. A dropped PEFT directory is read through the File and
// Directory Entries API (the only way a browser exposes a dropped folder's contents).

export const ADAPTER_FILES = ["adapter_config.json", "adapter_model.safetensors"];
// An adapter's own chat template, which the server keeps and renders its chats with.
export const TEMPLATE_FILES = ["chat_template.jinja", "tokenizer_config.json"];
const ARCHIVE = /\.(tar\.gz|tgz|tar|zip)$/i;

export function isArchive(name: string): boolean {
  return ARCHIVE.test(name);
}

/** The files to upload from what was picked: one archive as it is, or the two PEFT files of a
 * directory and its chat template if it has one (a saved PEFT directory also holds a README and
 * such, which the server does not need). */
export function adapterFiles(files: File[]): File[] {
  const archives = files.filter((file) => isArchive(file.name));
  if (archives.length > 0) return archives.slice(0, 1);
  const wanted = files.filter((file) => ADAPTER_FILES.includes(file.name) || TEMPLATE_FILES.includes(file.name));
  return wanted.length > 0 ? wanted : files;
}

/** A default adapter name from a directory or archive name: lowercased, safe characters only.
 * Loose PEFT files say nothing about the adapter's name ("adapter_config-json" would only confuse). */
export function suggestedName(source: string): string {
  if (ADAPTER_FILES.includes(source)) return "";
  return source
    .replace(ARCHIVE, "")
    .toLowerCase()
    .replace(/[^a-z0-9_-]+/g, "-")
    .replace(/^-+|-+$/g, "")
    .slice(0, 64);
}

function readEntry(entry: FileSystemEntry): Promise<File[]> {
  if (entry.isFile) {
    return new Promise((resolve, reject) => (entry as FileSystemFileEntry).file((file) => resolve([file]), reject));
  }
  const reader = (entry as FileSystemDirectoryEntry).createReader();
  return new Promise((resolve, reject) => {
    const found: Promise<File[]>[] = [];
    // readEntries answers in batches until it gives an empty one.
    const next = () =>
      reader.readEntries((entries) => {
        if (entries.length === 0) {
          Promise.all(found).then((lists) => resolve(lists.flat()), reject);
          return;
        }
        found.push(...entries.map(readEntry));
        next();
      }, reject);
    next();
  });
}

/** Every file of a drop, directories included, and the name of the first dropped item. */
export async function droppedFiles(transfer: DataTransfer): Promise<{ files: File[]; source: string }> {
  const entries = [...transfer.items]
    .map((item) => item.webkitGetAsEntry())
    .filter((entry): entry is FileSystemEntry => entry !== null);
  if (entries.length === 0) return { files: [...transfer.files], source: transfer.files[0]?.name ?? "" };
  const lists = await Promise.all(entries.map(readEntry));
  return { files: lists.flat(), source: entries[0].name };
}
