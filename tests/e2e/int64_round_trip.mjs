// A JavaScript client of the HTTP API, as the platform's TypeScript services are: Node's `fetch` and
// `JSON.parse`, nothing else. It walks every endpoint that answers ids, sends back the ids it read
// (as a client would: in paths and queries), and prints every id it saw, as JavaScript holds it.
// Input (argv[2], JSON): {base, user, seeded: [3 ids], userToken, adminToken, internalToken}.
"use strict";

const spec = JSON.parse(process.argv[2]);
const ID_FIELDS = new Set(["id", "userId", "originSessionId"]);
const seen = [];

/** Every id field anywhere in `value`, with its JavaScript type and its text. */
function collect(endpoint, value, path = "data") {
  if (Array.isArray(value)) {
    value.forEach((v, i) => collect(endpoint, v, `${path}[${i}]`));
  } else if (value !== null && typeof value === "object") {
    for (const [key, v] of Object.entries(value)) {
      if (ID_FIELDS.has(key) && v !== null) {
        seen.push({ endpoint, field: `${path}.${key}`, type: typeof v, value: String(v) });
      } else {
        collect(endpoint, v, `${path}.${key}`);
      }
    }
  }
}

async function call(endpoint, method, path, token, body) {
  const response = await fetch(spec.base + path, {
    method,
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const envelope = JSON.parse(await response.text());
  if (response.status >= 300 || envelope.code !== 0) {
    throw new Error(`${endpoint}: ${response.status} ${JSON.stringify(envelope)}`);
  }
  collect(endpoint, envelope.data);
  return envelope.data;
}

async function main() {
  const [first, second, third] = spec.seeded;
  const user = encodeURIComponent(spec.user);
  await call("list", "GET", "/api/v1/memory?pageSize=100", spec.userToken);
  await call("get", "GET", `/api/v1/memory/${first}`, spec.userToken);
  const created = await call("create", "POST", "/api/v1/memory", spec.userToken, {
    scope: "USER",
    content: "Node 客户端新建的记忆",
  });
  await call("patch", "PATCH", `/api/v1/memory/${created.id}`, spec.userToken, { content: "Node 客户端改过的记忆" });
  await call("patch", "PATCH", `/api/v1/memory/${second}`, spec.userToken, { status: "DISMISSED" });
  await call("history", "GET", `/api/v1/memory/${first}/history`, spec.userToken);
  await call("delete", "DELETE", `/api/v1/memory/${third}`, spec.userToken);
  await call("admin list", "GET", `/api/v1/admin/memory?userId=${user}&pageSize=100&status=ACTIVE`, spec.adminToken);
  await call("admin history", "GET", `/api/v1/admin/memory/${first}/history?userId=${user}`, spec.adminToken);
  await call("admin extractions", "GET", `/api/v1/admin/memory/extractions?userId=${user}`, spec.adminToken);
  const injection = await call("injection", "GET", `/internal/v1/memory/injection?userId=${user}`, spec.internalToken);
  const injected = injection.memories.map((m) => m.content);
  process.stdout.write(JSON.stringify({ seen, created: created.id, injected }));
}

main().catch((error) => {
  process.stderr.write(`${error.stack || error}\n`);
  process.exit(1);
});
