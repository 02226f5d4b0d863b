// The one way the console talks to the server: the public REST API with the user's key, through a client
// typed by the server's OpenAPI document (schema.d.ts): a path, parameter or body the server does not
// accept, or a field it does not answer, fails `npm run typecheck`.
// Every non-2xx answer becomes an ApiError carrying the server's own message, so pages
// can show it as it is instead of a generic "something went wrong".
import createClient, { type Client } from "openapi-fetch";
import type { paths } from "./schema";

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
    const error = errorFromJson(status, JSON.parse(text));
    if (error) return error;
  } catch {
    // not JSON: a proxy's page or plain text; shown as it is below
  }
  return new ApiError(status, text.trim() || `HTTP ${status}`);
}

/** The ApiError for a body openapi-fetch has read: parsed when it was JSON, else the text. */
export function errorFromValue(status: number, value: unknown): ApiError {
  if (typeof value === "string") return errorFromBody(status, value);
  return errorFromJson(status, value) ?? new ApiError(status, JSON.stringify(value) ?? `HTTP ${status}`);
}

function errorFromJson(status: number, value: unknown): ApiError | null {
  const body = (value ?? {}) as ApiErrorBody;
  if (body.error?.message) {
    return new ApiError(status, body.error.message, body.error.param ?? null, body.error.code ?? null,
      body.error.details ?? null);
  }
  if (typeof body.detail === "string") return new ApiError(status, body.detail);
  return null;
}

/** The body of a 2xx answer to a call of `api.http`; any other answer is thrown as an ApiError. */
export async function ok<Data>(call: Promise<{ data?: Data; error?: unknown; response: Response }>): Promise<Data> {
  const { data, error, response } = await call;
  if (!response.ok) throw errorFromValue(response.status, error);
  return data as Data;
}

export class Api {
  /** Every JSON route, typed by the OpenAPI document: `ok(api.http.GET("/v1/adapters/{name}", ...))`. */
  readonly http: Client<paths>;

  constructor(readonly key: string, readonly baseUrl = "") {
    this.http = createClient<paths>({ baseUrl, headers: { Authorization: `Bearer ${key}` } });
  }

  headers(extra: Record<string, string> = {}): Record<string, string> {
    return { Authorization: `Bearer ${this.key}`, ...extra };
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
