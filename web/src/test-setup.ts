// vitest runs without globals, so Testing Library cannot register its own cleanup: unmount every
// rendered tree after each test here, or one test's DOM would leak into the next one's queries.
import { cleanup } from "@testing-library/react";
import { afterEach } from "vitest";

afterEach(cleanup);
