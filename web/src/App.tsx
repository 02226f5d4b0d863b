import { Navigate, NavLink, Route, Routes } from "react-router-dom";
import { AdapterPage } from "./pages/AdapterPage";
import { AdaptersPage } from "./pages/AdaptersPage";
import { JobPage } from "./pages/JobPage";
import { KeyPage } from "./pages/KeyPage";
import { KeysPage } from "./pages/KeysPage";
import { PlaygroundPage } from "./pages/PlaygroundPage";
import { ServerPage } from "./pages/ServerPage";
import { SignInPage } from "./pages/SignInPage";
import { TenantLimitsPage } from "./pages/TenantLimitsPage";
import { TenantPage } from "./pages/TenantPage";
import { TenantsPage } from "./pages/TenantsPage";
import { TrainingPage } from "./pages/TrainingPage";
import { UploadPage } from "./pages/UploadPage";
import { SessionGate, useSession } from "./session";

export function App() {
  return (
    <SessionGate signIn={(props) => <SignInPage {...props} />}>
      <Shell />
    </SessionGate>
  );
}

function Shell() {
  const { me, signOut } = useSession();
  const admin = me.role === "admin";
  // An inference key reaches inference, the model list and its engine view only (docs/ACCESS.md).
  const developer = me.role !== "inference";
  return (
    <div className="shell">
      <a className="skip" href="#main">Skip to content</a>
      <header>
        <span className="brand">loraloom</span>
        <nav aria-label="Pages">
          {developer && <NavLink to="/adapters">Adapters</NavLink>}
          {developer && <NavLink to="/upload">Upload</NavLink>}
          {developer && <NavLink to="/training">Training</NavLink>}
          <NavLink to="/playground">Playground</NavLink>
          <NavLink to="/server">Server</NavLink>
          {admin && <NavLink to="/keys">Keys</NavLink>}
          {me.operator && <NavLink to="/tenants">Tenants</NavLink>}
        </nav>
        <span className="who" data-testid="who">
          tenant <strong>{me.tenant}</strong> · role <strong>{me.role}</strong> · key {me.key_prefix}…
        </span>
        <button type="button" onClick={signOut}>Sign out</button>
      </header>
      <main id="main">
        <Routes>
          <Route path="/" element={<Navigate to={developer ? "/adapters" : "/playground"} replace />} />
          <Route path="/adapters" element={developer ? <AdaptersPage /> : <NeedsDeveloper />} />
          <Route path="/adapters/:name" element={developer ? <AdapterPage /> : <NeedsDeveloper />} />
          <Route path="/upload" element={developer ? <UploadPage /> : <NeedsDeveloper />} />
          <Route path="/training" element={developer ? <TrainingPage /> : <NeedsDeveloper />} />
          <Route path="/training/:jobId" element={developer ? <JobPage /> : <NeedsDeveloper />} />
          <Route path="/playground" element={<PlaygroundPage />} />
          <Route path="/server" element={<ServerPage />} />
          <Route path="/keys" element={admin ? <KeysPage /> : <NotAllowed />} />
          <Route path="/keys/:keyId" element={admin ? <KeyPage /> : <NotAllowed />} />
          <Route path="/tenants" element={me.operator ? <TenantsPage /> : <NotAllowed />} />
          <Route path="/tenants/:name" element={me.operator ? <TenantPage /> : <NotAllowed />} />
          <Route path="/tenants/:name/keys/:keyId" element={me.operator ? <KeyPage /> : <NotAllowed />} />
          <Route path="/tenants/:name/limits" element={me.operator ? <TenantLimitsPage /> : <NotAllowed />} />
          <Route path="*" element={<p>No such page. <NavLink to="/adapters">Adapters</NavLink></p>} />
        </Routes>
      </main>
    </div>
  );
}

function NeedsDeveloper() {
  return <p role="alert">This page needs a developer or admin key; an inference key runs models only.</p>;
}

function NotAllowed() {
  return <p role="alert">This page needs an admin key.</p>;
}
