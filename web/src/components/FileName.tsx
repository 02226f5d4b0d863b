// A file the API names by id, shown by its name (the id beside it, to copy); the bare id while the
// names load or for a file since deleted.
export function FileName({ id, names }: { id: string; names: Map<string, string> | undefined }) {
  const name = names?.get(id);
  if (name === undefined) return <code>{id}</code>;
  return (
    <span className="file-name" title={id}>
      {name} <code className="muted">{id}</code>
    </span>
  );
}
