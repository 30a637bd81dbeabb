// The OpenAI-compatible HTTP front of the engine (Boost.Beast over Asio):
//
//   POST /v1/chat/completions, POST /v1/completions   (JSON, or SSE with "stream": true)
//   GET  /v1/models, /v1/models/{id}, /health, /metrics (Prometheus text)
//
// Threads: one I/O thread runs every connection asynchronously (accept,
// reads under deadlines, writes), so an idle or slow client holds no thread.
// A completion runs on one of http_threads worker threads from when its body
// has arrived to its last byte: its tokens arrive on the engine thread and
// are handed over through a small queue, so decoding, stop matching and
// handing bytes to the I/O thread happen on the worker and the engine thread
// never blocks on a socket. A streamed request whose client goes away (a
// write fails) is cancelled in the engine.
//
// Limits on what a client may do: the request head within header_timeout_s
// of its first byte, the body within body_timeout_s and at most
// max_body_bytes (Content-Length or chunked: 413 either way), a kept-alive
// connection idle at most keep_alive_timeout_s, each response write done
// within body_timeout_s. Pipelined requests are answered in order.
//
// Ownership: the engine and the tokenizer must outlive the server. Shutdown()
// (also run by the destructor) refuses new completions with 503, waits for
// the running ones up to drain_timeout_s, cancels what is left (those answer
// 503, or an error event in a stream), then closes every connection; it does
// not shut the engine down.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/text_conventions.h"
#include "data/tokenizer.h"
#include "serve/billing.h"
#include "serve/chat_template.h"
#include "serve/engine.h"
#include "serve/http/front.h"

namespace myriad::serve {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;                        // 0: any free port (see HttpServer::port())
  std::string api_key;                    // empty: no authentication
  size_t max_body_bytes = 1 << 20;        // larger bodies get 413
  std::string model_name = "myriad";      // the one model id served
  int64_t context_tokens = 0;             // prompt + output limit (the model's max_seq_len)
  int64_t vocab_size = 0;                 // the model's logits, token ids below it (0: the tokenizer's size)
  int http_threads = 96;                  // completions executed at once (worker threads)
  double drain_timeout_s = 60;            // Shutdown waits this long, then cancels
  int sse_keepalive_ms = 1000;            // an SSE comment after this long without tokens
  int retry_after_s = 1;                  // Retry-After on 429
  double header_timeout_s = 10;           // a request head must arrive within this, from its first byte
  double body_timeout_s = 30;             // a body must arrive, and each response write finish, within this
  double keep_alive_timeout_s = 5;        // an idle connection is closed after this
  // The model's own eos ids (a Hugging Face model's config / generation
  // config); with the tokenizer they give the prompt framing and the stop
  // ids (TextConventions::For).
  std::vector<int64_t> model_eos_ids;
};

// Counters the server keeps itself (the engine keeps the rest).
struct ServerCounters {
  int64_t http_requests = 0;
  int64_t completions_ok = 0;           // finished with a response (stop or length)
  int64_t completions_cancelled = 0;    // the client went away
  int64_t completions_failed = 0;       // engine error
  int64_t rejected_busy = 0;            // 429
  int64_t bad_requests = 0;             // 4xx other than 429
  int64_t stopped_by_text = 0;          // a stop string matched on decoded text
};

class HttpServer {
 public:
  HttpServer(Engine* engine, const Tokenizer* tokenizer, ChatTemplate chat_template, PriceTable prices,
             ServerConfig cfg);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // A front that may answer completions elsewhere (edge/edge_front.h);
  // set before Start, not owned, must outlive the server.
  void SetFront(CompletionFront* front);

  // Binds and starts serving on a background thread. Errors name host:port.
  Status Start();
  int port() const;
  std::string url() const;  // http://host:port
  // Graceful stop (idempotent): 503 for new completions, wait for running
  // ones up to drain_timeout_s, cancel what is left, stop listening.
  void Shutdown();

  std::string MetricsText();  // GET /metrics
  std::string Summary();      // human-readable totals for the shutdown log
  ServerCounters counters() const;
  BillingLedger::Totals billing() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace myriad::serve
