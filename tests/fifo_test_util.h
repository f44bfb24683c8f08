// Reading a FIFO in tests: a reader that blocks in open() on a FIFO with no writer must fail the
// test, not hang the suite.
// Thread safety: each call owns its thread.
#pragma once
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>
#include <string>
#include <thread>

#include "core/check.h"

namespace ft {
namespace fifo_test {

// The ft::Error message of `read`, run on a thread so that a reader blocking on `fifo` fails the
// test after 10 s: a writer opened then releases it.
inline std::string error_reading_fifo(const std::string& fifo, const std::function<void()>& read) {
  std::promise<std::string> message;
  std::future<std::string> done = message.get_future();
  std::thread reader([&] {
    try {
      read();
      message.set_value("<no ft::Error thrown>");
    } catch (const Error& e) {
      message.set_value(e.what());
    }
  });
  if (done.wait_for(std::chrono::seconds(10)) == std::future_status::timeout) {
    ADD_FAILURE() << "reading the FIFO " << fifo << " blocked for 10 s";
    const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (writer >= 0) ::close(writer);
  }
  reader.join();
  return done.get();
}

}  // namespace fifo_test
}  // namespace ft
