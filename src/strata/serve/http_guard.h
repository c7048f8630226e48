// What keeps slow or numerous clients from taking the server down, around cpp-httplib's
// thread-per-connection model:
// - a whole-request deadline: a connection must deliver a whole request (headers and body) within
//   the deadline, however it trickles the bytes; the library's own timeout is per read, so one byte
//   every few seconds would hold a thread for ever. A watchdog shuts the socket down at the deadline.
// - a connection cap: beyond it a connection is not given a thread; one event-loop thread reads its
//   request line without blocking and answers /health (so health checks work under a flood) and 503
//   to anything else.
// - the connection's socket is known to its handler (current_connection()), so a handler waiting for
//   a slot can see that its client went away.
// The guard runs the accept loop itself (the library's loop hides the accepted socket) and hands each
// connection under the cap to the library's per-connection processing.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace strata::serve {

struct GuardOptions {
  int request_deadline_s = 30;  // headers and body of one request
  int keep_alive_s = 5;         // the library's wait for the next request on a kept-alive connection
  int max_connections = 256;
  // The /health answer for a connection beyond the cap: status and JSON body.
  std::function<std::pair<int, std::string>()> health;
};

// One connection being served by a pool thread.
class Connection {
 public:
  // The request has been read whole: the deadline no longer applies (answers may take long).
  void request_read();
  // The answer was written: the next request on this connection gets a fresh deadline.
  void answer_written();
  // Shut the connection once the current answer is written (the rest of its body was not read).
  void close_after_answer() { close_after_answer_ = true; }
  // True when the client has closed its side (or reset the connection).
  bool client_gone() const;

 private:
  friend class HttpGuard;
  int watch_fd = -1;  // a duplicate of the socket: valid until the entry is removed, never reused
  std::chrono::steady_clock::time_point deadline;
  bool armed = true;
  bool close_after_answer_ = false;
  class HttpGuard* owner = nullptr;
};

// The connection the calling thread serves (nullptr outside a request handler).
Connection* current_connection();

class HttpGuard {
 public:
  // `server` has the routes and must be bound (bind_to_port / bind_to_any_port) before listen().
  HttpGuard(httplib::Server& server, GuardOptions options);
  ~HttpGuard();
  HttpGuard(const HttpGuard&) = delete;
  HttpGuard& operator=(const HttpGuard&) = delete;

  // Accepts and serves connections until stop(); false when accepting failed for good.
  bool listen();
  // Ends listen(): no new connections; those being served finish.
  void stop();

 private:
  friend class Connection;
  void serve(int sock);
  void rearm(Connection& c, std::chrono::steady_clock::time_point deadline);
  void watchdog();
  void overflow_step();

  httplib::Server& server_;
  GuardOptions opt_;
  std::atomic<bool> stop_requested_{false};
  std::atomic<int> active_{0};
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Connection*> watched_;
  bool stopping_ = false;
  std::thread watchdog_;

  struct Overflow {
    int fd;
    std::chrono::steady_clock::time_point deadline;
    std::string head;
  };
  std::vector<Overflow> overflow_;  // only the accept loop's thread touches it
};

}  // namespace strata::serve
