// The job form's fields, defaults and help texts come from the server's own OpenAPI document
// (components.schemas.Hyperparameters of web/src/api/openapi.json, which tests/web/test_api_types.py keeps
// equal to what the server serves), so the form never disagrees with what the API accepts.

export interface FieldSpec {
  name: string;
  type: "integer" | "number" | "array";
  default: number | string[];
  description: string;
  minimum?: number;
  maximum?: number;
}

interface JsonSchemaProperty {
  type?: string;
  default?: unknown;
  description?: string;
  minimum?: number;
  maximum?: number;
  exclusiveMinimum?: number;
  exclusiveMaximum?: number;
}

/** The fields of one schema: `Hyperparameters` (a supervised job's) or `DpoHyperparameters` (with beta). */
export function hyperparameterFields(openapi: unknown, schema = "Hyperparameters"): FieldSpec[] {
  const schemas = (openapi as { components?: { schemas?: Record<string, { properties?: Record<string, JsonSchemaProperty> }> } })
    .components?.schemas;
  const properties = schemas?.[schema]?.properties ?? {};
  return Object.entries(properties).map(([name, property]) => ({
    name,
    type: property.type === "array" ? "array" : property.type === "integer" ? "integer" : "number",
    default: (property.default ?? (property.type === "array" ? [] : 0)) as number | string[],
    description: property.description ?? "",
    minimum: property.minimum ?? property.exclusiveMinimum,
    maximum: property.maximum ?? property.exclusiveMaximum,
  }));
}

/** The form's text values as the request's hyperparameters: only the fields changed from their default. */
export function hyperparameterBody(fields: FieldSpec[], values: Record<string, string>): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  for (const field of fields) {
    const text = values[field.name];
    if (text === undefined || text.trim() === "") continue;
    if (field.type === "array") {
      const list = text.split(",").map((item) => item.trim()).filter(Boolean);
      if (list.join(",") !== (field.default as string[]).join(",")) body[field.name] = list;
    } else {
      const number = Number(text);
      // Not a number: sent as typed, so the server's message names the field.
      const value = Number.isNaN(number) ? text : number;
      if (value !== field.default) body[field.name] = value;
    }
  }
  return body;
}

export function defaultText(field: FieldSpec): string {
  return Array.isArray(field.default) ? field.default.join(", ") : String(field.default);
}

/** The default as the help text says it: a list without a default means the server's full list. */
export function defaultHelp(field: FieldSpec): string {
  return Array.isArray(field.default) && field.default.length === 0 ? "all of them (leave empty)" : defaultText(field);
}
