// The one way the console talks to the server: the public REST API with the user's key.
// Every non-2xx answer becomes an ApiError carrying the server's own message, so pages
// can show it as it is instead of a generic "something went wrong".

export interface ApiErrorBody {
  error?: { message?: string; type?: string; param?: string | null; code?: string | null; details?: unknown };
  detail?: unknown;
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly param: string | null = null,
    readonly code: string | null = null,
    readonly details: unknown = null,
  ) {
    super(message);
    this.name = "ApiError";
  }
}

/** The ApiError for a response body (already read as text), whatever shape it has. */
export function errorFromBody(status: number, text: string): ApiError {
  try {
    const body = JSON.parse(text) as ApiErrorBody;
    if (body.error?.message) {
      return new ApiError(status, body.error.message, body.error.param ?? null, body.error.code ?? null,
        body.error.details ?? null);
    }
    if (typeof body.detail === "string") return new ApiError(status, body.detail);
  } catch {
    // not JSON: a proxy's page or plain text; shown as it is below
  }
  return new ApiError(status, text.trim() || `HTTP ${status}`);
}

export class Api {
  constructor(readonly key: string, readonly baseUrl = "") {}

  headers(extra: Record<string, string> = {}): Record<string, string> {
    return { Authorization: `Bearer ${this.key}`, ...extra };
  }

  async request<T>(method: string, path: string, body?: unknown): Promise<T> {
    const response = await fetch(this.baseUrl + path, {
      method,
      headers: this.headers(body === undefined ? {} : { "Content-Type": "application/json" }),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await response.text();
    if (!response.ok) throw errorFromBody(response.status, text);
    return (text ? JSON.parse(text) : null) as T;
  }

  get<T>(path: string): Promise<T> {
    return this.request<T>("GET", path);
  }
  post<T>(path: string, body?: unknown): Promise<T> {
    return this.request<T>("POST", path, body ?? {});
  }
  put<T>(path: string, body: unknown): Promise<T> {
    return this.request<T>("PUT", path, body);
  }
  delete<T>(path: string): Promise<T> {
    return this.request<T>("DELETE", path);
  }

  /** A multipart POST with upload progress (fetch cannot report it; XMLHttpRequest can). */
  upload<T>(path: string, form: FormData, onProgress: (fraction: number) => void): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const xhr = new XMLHttpRequest();
      xhr.open("POST", this.baseUrl + path);
      xhr.setRequestHeader("Authorization", `Bearer ${this.key}`);
      xhr.upload.onprogress = (event) => {
        if (event.lengthComputable) onProgress(event.loaded / event.total);
      };
      xhr.onload = () => {
        if (xhr.status >= 200 && xhr.status < 300) resolve(JSON.parse(xhr.responseText) as T);
        else reject(errorFromBody(xhr.status, xhr.responseText));
      };
      xhr.onerror = () => reject(new ApiError(0, "The server could not be reached"));
      xhr.send(form);
    });
  }
}

/** Query-string helper that leaves out undefined values. */
export function withQuery(path: string, params: Record<string, string | number | boolean | undefined | null>): string {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null) search.set(name, String(value));
  }
  const text = search.toString();
  if (!text) return path;
  return `${path}${path.includes("?") ? "&" : "?"}${text}`;
}
