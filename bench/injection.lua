-- wrk script for bench case 3: a random user of the seeded pool per request, with its project.
local users = tonumber(os.getenv("BENCH_INJECT_USERS") or "10000")
local token = os.getenv("BENCH_INTERNAL_TOKEN") or "bench-internal-token-bench-internal-token"
math.randomseed(os.time())

request = function()
  local u = math.random(1, users)
  local path = "/internal/v1/memory/injection?userId=" .. u .. "&projectKey=proj-" .. (u % 10)
  return wrk.format("GET", path, { ["Authorization"] = "Bearer " .. token })
end

done = function(summary, latency, requests)
  io.write(string.format("JSON {\"p50_ms\": %.2f, \"p99_ms\": %.2f, \"requests\": %d, \"errors\": %d, \"seconds\": %.3f}\n",
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, summary.requests,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.status + summary.errors.timeout,
    summary.duration / 1e6))
end
