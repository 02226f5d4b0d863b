/// <reference types="vitest/config" />
import react from "@vitejs/plugin-react";
import { defineConfig } from "vite";

// Built into dist/ and served by the API server itself at /console (platform/api/console.py).
export default defineConfig({
  base: "/console/",
  plugins: [react()],
  // `npm run dev` next to `loraloom serve`: the API calls go to that server.
  server: { proxy: { "/v1": "http://127.0.0.1:8000" } },
  build: { chunkSizeWarningLimit: 600 },
  test: { environment: "jsdom", include: ["src/**/*.test.ts", "src/**/*.test.tsx"], setupFiles: ["src/test-setup.ts"] },
});
