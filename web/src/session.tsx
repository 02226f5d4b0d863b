// The signed-in key: kept in sessionStorage (gone when the browser session ends, and on
// sign-out), checked against GET /v1/me, which also says the tenant and role to show.
import { useQuery, useQueryClient } from "@tanstack/react-query";
import { createContext, type ReactNode, useCallback, useContext, useMemo, useState } from "react";
import { Api, ApiError, ok } from "./api/client";
import { queryKeys } from "./api/queryKeys";
import type { Me } from "./api/types";

const STORAGE_KEY = "loraloom.apiKey";

export interface Session {
  api: Api;
  me: Me;
  signOut: () => void;
}

// Exported for component tests, which render a page inside a session of their own.
export const SessionContext = createContext<Session | null>(null);

export function useSession(): Session {
  const session = useContext(SessionContext);
  if (session === null) throw new Error("useSession outside a signed-in page");
  return session;
}

export function useApi(): Api {
  return useSession().api;
}

export function storedKey(): string | null {
  return sessionStorage.getItem(STORAGE_KEY);
}

interface Props {
  signIn: (props: { onKey: (key: string) => void; error: Error | null; checking: boolean }) => ReactNode;
  children: ReactNode;
}

/** Renders `signIn` until a key is accepted by the server, then `children` with the session. */
export function SessionGate({ signIn, children }: Props) {
  const client = useQueryClient();
  const [key, setKey] = useState<string | null>(storedKey);
  const api = useMemo(() => (key ? new Api(key) : null), [key]);
  const me = useQuery({
    queryKey: queryKeys.me(key ?? ""),
    queryFn: () => ok(api!.http.GET("/v1/me")),
    enabled: api !== null,
    retry: false,
    staleTime: Infinity,
  });
  const signOut = useCallback(() => {
    sessionStorage.removeItem(STORAGE_KEY);
    client.clear(); // nothing one key fetched may show for the next
    setKey(null);
  }, [client]);
  const onKey = useCallback((entered: string) => {
    sessionStorage.setItem(STORAGE_KEY, entered);
    setKey(entered);
  }, []);

  if (api !== null && me.data) {
    return <SessionContext.Provider value={{ api, me: me.data, signOut }}>{children}</SessionContext.Provider>;
  }
  // A refused key is forgotten, so a reload does not try it again; the server's message stays shown.
  if (me.error instanceof ApiError && me.error.status === 401 && storedKey() !== null) {
    sessionStorage.removeItem(STORAGE_KEY);
  }
  return <>{signIn({ onKey, error: me.error, checking: api !== null && me.isFetching })}</>;
}
