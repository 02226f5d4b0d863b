import { KeysSection } from "../components/KeysSection";
import { useSession } from "../session";

export function KeysPage() {
  const { me } = useSession();
  return (
    <section>
      <h1>API keys of {me.tenant}</h1>
      <p className="muted">Open a key to revoke it.</p>
      <KeysSection />
    </section>
  );
}
