#include "metrics.hpp"

#include <cstdio>

namespace {

/// Appends printf-formatted text, however long (the reactor's summary line is over 300
/// characters: a fixed buffer cut its latencies off).
void append(std::string& out, const char* fmt, auto... args) {
  const int n = std::snprintf(nullptr, 0, fmt, args...);
  if (n <= 0) return;
  const std::size_t at = out.size();
  out.resize(at + static_cast<std::size_t>(n) + 1);  // snprintf writes the terminating NUL too
  std::snprintf(out.data() + at, static_cast<std::size_t>(n) + 1, fmt, args...);
  out.resize(at + static_cast<std::size_t>(n));
}

/// Label values are ours (mode, device description): escape what the format requires anyway.
std::string escape_label(std::string_view v) {
  std::string s;
  for (char c : v) {
    if (c == '\\' || c == '"') s += '\\';
    if (c == '\n') {
      s += "\\n";
      continue;
    }
    s += c;
  }
  return s;
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void counter(std::string& out, const char* name, const char* help, std::uint64_t v) {
  header(out, name, "counter", help);
  append(out, "%s %llu\n", name, static_cast<unsigned long long>(v));
}

/// The reactor's buckets: bucket i counts [2^i, 2^(i+1)) ns, so its cumulative upper bound is
/// 2^(i+1) ns. All 40 buckets are written every time: Prometheus wants a stable bucket set. The
/// reactor keeps no sum of its samples: _sum is NaN, the format's "unknown" (an estimate from the
/// buckets would be a made-up number in a field meant to be exact).
void reactor_histogram(std::string& out, const char* name, const char* help,
                       const evr::latency_histogram& h) {
  header(out, name, "histogram", help);
  std::uint64_t cumulative = 0;
  for (int i = 0; i < evr::latency_histogram::buckets; ++i) {
    cumulative += h.counts[static_cast<std::size_t>(i)];
    const double le = static_cast<double>(std::uint64_t{1} << (i + 1)) * 1e-9;
    append(out, "%s_bucket{le=\"%.9g\"} %llu\n", name, le,
           static_cast<unsigned long long>(cumulative));
  }
  append(out, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum NaN\n%s_count %llu\n", name,
         static_cast<unsigned long long>(cumulative), name, name,
         static_cast<unsigned long long>(cumulative));
}

/// {labels} or {labels,le="x"}: Prometheus wants one brace set per sample.
std::string with_le(std::string_view labels, const char* le) {
  std::string s = "{";
  if (!labels.empty()) {
    s += labels;
    s += ',';
  }
  s += "le=\"";
  s += le;
  s += "\"}";
  return s;
}

std::string braces(std::string_view labels) {
  std::string s;
  if (labels.empty()) return s;
  s.reserve(labels.size() + 2);
  s += '{';
  s += labels;
  s += '}';
  return s;
}

}  // namespace

template <std::size_t Bounds>
void histogram<Bounds>::record(const std::array<double, Bounds>& bounds, double v) noexcept {
  std::size_t b = 0;
  while (b < Bounds && v > bounds[b]) ++b;
  counts_[b].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

template <std::size_t Bounds>
void histogram<Bounds>::render(const std::array<double, Bounds>& bounds, std::string& out,
                               const char* name, std::string_view labels) const {
  std::uint64_t cumulative = 0;
  for (std::size_t b = 0; b < Bounds; ++b) {
    cumulative += counts_[b].load(std::memory_order_relaxed);
    char le[32];
    std::snprintf(le, sizeof le, "%g", bounds[b]);
    append(out, "%s_bucket%s %llu\n", name, with_le(labels, le).c_str(),
           static_cast<unsigned long long>(cumulative));
  }
  cumulative += counts_[Bounds].load(std::memory_order_relaxed);
  append(out, "%s_bucket%s %llu\n", name, with_le(labels, "+Inf").c_str(),
         static_cast<unsigned long long>(cumulative));
  // The sum is read after the counts: a sample recorded in between makes it a little ahead of
  // _count, never behind by more than the samples in flight (statistics, not an invariant).
  append(out, "%s_sum%s %.9g\n", name, braces(labels).c_str(),
         sum_.load(std::memory_order_relaxed));
  append(out, "%s_count%s %llu\n", name, braces(labels).c_str(),
         static_cast<unsigned long long>(cumulative));
}

std::size_t server_metrics::path_index(std::string_view path) noexcept {
  for (std::size_t i = 0; i + 1 < paths.size(); ++i)
    if (paths[i] == path) return i;
  return paths.size() - 1;
}

void server_metrics::record(std::string_view path, int status,
                            std::chrono::nanoseconds latency) noexcept {
  const std::size_t p = path_index(path);
  std::size_t s = other_status;
  for (std::size_t i = 0; i < statuses.size(); ++i)
    if (statuses[i] == status) s = i;
  requests_[p][s].fetch_add(1, std::memory_order_relaxed);
  duration_[p].record(latency_bounds, std::chrono::duration<double>(latency).count());
}

void server_metrics::record_gpu_wait(std::string_view path,
                                     std::chrono::nanoseconds latency) noexcept {
  gpu_wait_[path_index(path)].record(latency_bounds,
                                     std::chrono::duration<double>(latency).count());
}

void server_metrics::record_batch(std::size_t rows) noexcept {
  batches_.record(batch_bounds, static_cast<double>(rows));
}

void server_metrics::record_check(bool agreed) noexcept {
  checks_[agreed ? 0 : 1].fetch_add(1, std::memory_order_relaxed);
}

std::uint64_t server_metrics::count(int lo, int hi) const noexcept {
  std::uint64_t total = 0;
  for (const auto& row : requests_) {
    for (std::size_t s = 0; s < statuses.size(); ++s)
      if (statuses[s] >= lo && statuses[s] <= hi) total += row[s].load(std::memory_order_relaxed);
  }
  return total;
}

std::string server_metrics::render(const evr::reactor_metrics* reactor, const info& about,
                                   const gauges& now) const {
  std::string out;
  out.reserve(16384);

  header(out, "evr_server_info", "gauge", "How this server runs (value always 1).");
  out += "evr_server_info{mode=\"" + escape_label(about.mode) + "\",sync=\"" +
         escape_label(about.sync) + "\",device=\"" + escape_label(about.device) + "\",strategy=\"" +
         escape_label(about.strategy) + "\",threads=\"" + std::to_string(about.threads) +
         "\",lanes=\"" + std::to_string(about.lanes) + "\",devices=\"" +
         std::to_string(about.devices) + "\"} 1\n";

  header(out, "evr_server_requests_total", "counter",
         "HTTP requests answered, by path and status.");
  for (std::size_t p = 0; p < paths.size(); ++p) {
    for (std::size_t s = 0; s <= statuses.size(); ++s) {
      const std::uint64_t v = requests_[p][s].load(std::memory_order_relaxed);
      if (v == 0) continue;  // a zero series adds nothing a query could not assume
      const std::string status = s == other_status ? "other" : std::to_string(statuses[s]);
      append(out, "evr_server_requests_total{path=\"%.*s\",status=\"%s\"} %llu\n",
             static_cast<int>(paths[p].size()), paths[p].data(), status.c_str(),
             static_cast<unsigned long long>(v));
    }
  }
  header(out, "evr_server_requests_in_flight", "gauge",
         "Requests whose head was read and whose response is not yet written.");
  append(out, "evr_server_requests_in_flight %lld\n", static_cast<long long>(in_flight()));
  header(out, "evr_server_connections", "gauge", "Connections open (this one included).");
  append(out, "evr_server_connections %zu\n", now.connections);
  header(out, "evr_server_lanes_leased", "gauge", "Lanes taken by work now.");
  append(out, "evr_server_lanes_leased %zu\n", now.lanes_leased);
  header(out, "evr_server_request_memory_bytes", "gauge",
         "Request buffers held beyond the lanes' own (used), and their budget (limit).");
  append(out, "evr_server_request_memory_bytes{of=\"used\"} %llu\n",
         static_cast<unsigned long long>(now.request_memory));
  append(out, "evr_server_request_memory_bytes{of=\"limit\"} %llu\n",
         static_cast<unsigned long long>(now.request_memory_limit));
  header(out, "evr_server_large_requests", "gauge",
         "Large /saxpy and /sum requests running, and waiting for their turn.");
  append(out, "evr_server_large_requests{state=\"running\"} %zu\n", now.large_running);
  append(out, "evr_server_large_requests{state=\"waiting\"} %zu\n", now.large_waiting);
  counter(out, "evr_server_connections_accepted_total", "Connections accepted.",
          connections(connection_event::accepted));
  header(out, "evr_server_connections_refused_total", "counter",
         "Connections refused: over the per-address limit, the server full with none idle, or "
         "out of descriptors.");
  const std::pair<const char*, connection_event> refusals[] = {
      {"per_address", connection_event::refused_per_address},
      {"total", connection_event::refused_total},
      {"descriptors", connection_event::refused_descriptors}};
  for (const auto& [reason, e] : refusals)
    append(out, "evr_server_connections_refused_total{reason=\"%s\"} %llu\n", reason,
           static_cast<unsigned long long>(connections(e)));
  counter(out, "evr_server_connections_evicted_total",
          "Connections waiting for a request head closed to make room for new ones.",
          connections(connection_event::evicted));

  auto path_label = [](std::string_view p) { return "path=\"" + std::string(p) + "\""; };
  header(out, "evr_server_request_duration_seconds", "histogram",
         "From a request's head being read to its response being written, by path.");
  for (std::size_t p = 0; p < paths.size(); ++p)
    duration_[p].render(latency_bounds, out, "evr_server_request_duration_seconds",
                        path_label(paths[p]));
  header(out, "evr_server_gpu_wait_seconds", "histogram",
         "From a request's GPU work being enqueued to the request knowing it is done, by path.");
  for (std::size_t p = 0; p < paths.size(); ++p)
    gpu_wait_[p].render(latency_bounds, out, "evr_server_gpu_wait_seconds", path_label(paths[p]));
  header(out, "evr_server_mlp_batch_rows", "histogram", "Rows per /mlp batch run on the GPU.");
  batches_.render(batch_bounds, out, "evr_server_mlp_batch_rows", "");
  header(out, "evr_server_checks_total", "counter",
         "Answers compared with the CPU's reference, by result.");
  append(out, "evr_server_checks_total{result=\"agreed\"} %llu\n",
         static_cast<unsigned long long>(checks_[0].load(std::memory_order_relaxed)));
  append(out, "evr_server_checks_total{result=\"wrong\"} %llu\n",
         static_cast<unsigned long long>(checks_[1].load(std::memory_order_relaxed)));

  header(out, "evr_server_requests_abandoned_total", "counter",
         "Requests left unanswered because their client left (or the server stopped): queued "
         "(dropped before any GPU work) or running (the work finished, nobody to answer).");
  append(out, "evr_server_requests_abandoned_total{stage=\"queued\"} %llu\n",
         static_cast<unsigned long long>(abandoned(true)));
  append(out, "evr_server_requests_abandoned_total{stage=\"running\"} %llu\n",
         static_cast<unsigned long long>(abandoned(false)));

  if (reactor != nullptr) {
    const evr::reactor_metrics& m = *reactor;
    counter(out, "evr_reactor_submitted_total", "Waits accepted by the reactor.", m.submitted);
    counter(out, "evr_reactor_completed_total", "Waits completed with success.", m.completed);
    counter(out, "evr_reactor_cancelled_total", "Waits completed with operation_aborted.",
            m.cancelled);
    counter(out, "evr_reactor_failed_total", "Waits completed with a device error.", m.failed);
    counter(out, "evr_reactor_rejected_total", "Waits refused at submission.", m.rejected);
    header(out, "evr_reactor_in_flight", "gauge", "Waits submitted and not yet completed.");
    append(out, "evr_reactor_in_flight %llu\n", static_cast<unsigned long long>(m.in_flight));
    counter(out, "evr_reactor_sweeps_total", "Passes over the pending streams.", m.sweeps);
    counter(out, "evr_reactor_event_queries_total", "Event queries (driver calls), on any thread.",
            m.event_queries);
    counter(out, "evr_reactor_stream_queries_total", "Stream queries (fault probes).",
            m.stream_queries);
    counter(out, "evr_reactor_doorbells_total", "Host-function doorbells armed (adaptive).",
            m.doorbells);
    counter(out, "evr_reactor_parks_total", "Times the reactor thread slept.", m.parks);
    counter(out, "evr_reactor_prediction_misses_total",
            "Waits that outlived their predicted window.", m.prediction_misses);
    counter(out, "evr_reactor_scout_looks_total",
            "Looks at long steady work before its window (scouts).", m.scout_looks);
    counter(out, "evr_reactor_scout_finds_total", "Waits that scouts found done.", m.scout_finds);
    counter(out, "evr_reactor_host_passes_total",
            "Passes run by the io threads themselves (the last hop).", m.host_passes);
    counter(out, "evr_reactor_host_completions_total",
            "Completions the io threads' own passes found.", m.host_completions);
    counter(out, "evr_reactor_host_passes_cut_total",
            "io threads' passes that delivered before their other due looks.", m.host_passes_cut);
    counter(out, "evr_reactor_host_event_queries_total",
            "Event queries the io threads' own passes made (part of event_queries).",
            m.host_event_queries);
    counter(out, "evr_reactor_host_intakes_total", "io threads' passes that took submitted waits.",
            m.host_intakes);
    counter(out, "evr_reactor_pass_lock_sleeps_total",
            "Times the reactor thread slept until an io thread's pass ended.", m.pass_lock_sleeps);
    counter(out, "evr_reactor_wakeups_total", "Times a submission or host function woke it.",
            m.wakeups);
    header(out, "evr_reactor_streams", "gauge", "Distinct streams the reactor knows.");
    append(out, "evr_reactor_streams %llu\n", static_cast<unsigned long long>(m.streams));
    reactor_histogram(out, "evr_reactor_submit_to_deliver_seconds",
                      "From a wait's submission to its handler being posted (GPU time included; "
                      "_sum unknown: the reactor keeps none).",
                      m.submit_to_deliver);
    reactor_histogram(out, "evr_reactor_detect_to_deliver_seconds",
                      "From the sweep that saw a wait done to its handler being posted (_sum "
                      "unknown: the reactor keeps none).",
                      m.detect_to_deliver);
  }
  return out;
}

std::string reactor_summary(const evr::reactor_metrics& m) {
  std::string out;
  append(
      out,
      "submitted %llu, completed %llu, cancelled %llu, failed %llu, in flight %llu, sweeps %llu, "
      "event queries %llu (io threads %llu), stream queries %llu, doorbells %llu, parks %llu, "
      "wake-ups %llu, "
      "prediction misses %llu, host passes %llu (completions found %llu), "
      "submit->deliver p50 <= %.1f us, p99 <= %.1f us",
      static_cast<unsigned long long>(m.submitted), static_cast<unsigned long long>(m.completed),
      static_cast<unsigned long long>(m.cancelled), static_cast<unsigned long long>(m.failed),
      static_cast<unsigned long long>(m.in_flight), static_cast<unsigned long long>(m.sweeps),
      static_cast<unsigned long long>(m.event_queries),
      static_cast<unsigned long long>(m.host_event_queries),
      static_cast<unsigned long long>(m.stream_queries),
      static_cast<unsigned long long>(m.doorbells), static_cast<unsigned long long>(m.parks),
      static_cast<unsigned long long>(m.wakeups),
      static_cast<unsigned long long>(m.prediction_misses),
      static_cast<unsigned long long>(m.host_passes),
      static_cast<unsigned long long>(m.host_completions),
      static_cast<double>(m.submit_to_deliver.quantile_upper_ns(0.5)) / 1e3,
      static_cast<double>(m.submit_to_deliver.quantile_upper_ns(0.99)) / 1e3);
  return out;
}
