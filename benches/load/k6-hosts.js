// k6 version of the rotating-hosts workload (the same as wrk with
// benches/load/hosts.lua): GET / with `Host: tenant-<n>.<SUFFIX>`, n
// rotating over HOSTS tenant hosts, over HTTP/1.1 keep-alive connections
// (one per VU). Needs k6 >= 0.30 (earlier versions dropped a Host header
// set in params).
//
//   k6 run benches/load/k6-hosts.js
//   k6 run -e TARGET=http://127.0.0.1:18080/ -e VUS=256 -e DURATION=30s -e HOSTS=1 benches/load/k6-hosts.js
//
// Environment (k6's -e, or the process environment), defaults:
//   TARGET=http://127.0.0.1:8080/   the proxy's URL (shardgate's quickstart listener)
//   VUS=32                         virtual users = concurrent connections
//   DURATION=10s                   run time (k6 duration syntax)
//   HOSTS=1000                     tenant hosts to rotate over (1: one host)
//   SUFFIX=.localhost              host suffix (shardgate: domains.fallback_suffix)
import http from "k6/http";
import { check } from "k6";

const TARGET = __ENV.TARGET || "http://127.0.0.1:8080/";
const VUS = parseInt(__ENV.VUS || "32", 10);
const HOSTS = parseInt(__ENV.HOSTS || "1000", 10);
const SUFFIX = __ENV.SUFFIX || ".localhost";

export const options = {
  vus: VUS,
  duration: __ENV.DURATION || "10s",
  discardResponseBodies: true,
  summaryTrendStats: ["avg", "min", "med", "p(90)", "p(99)", "max"],
  thresholds: {
    // Refusals (rate limits, 5xx) make the numbers meaningless: fail the run.
    http_req_failed: ["rate<0.001"],
  },
};

// Each VU rotates over every host, starting at its own offset (__VU counts
// from 1), so that the VUs together spread the load over all HOSTS hosts
// from the first second.
const STEP = Math.ceil(HOSTS / VUS);

export default function () {
  const n = (((__VU - 1) * STEP + __ITER) % HOSTS) + 1;
  const res = http.get(TARGET, { headers: { Host: `tenant-${n}${SUFFIX}` } });
  check(res, { "status is 200": (r) => r.status === 200 });
}
