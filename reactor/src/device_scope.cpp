// reactor/src/device_scope.cpp — see device_scope.hpp.
#include "device_scope.hpp"

namespace evr::detail {

std::error_code device_scope::select(int device) noexcept {
  if (device < 0) return {};
  if (borrowed_) return select_borrowed(device);
  if (device == current_device_) return {};
  if (auto ec = backend_.set_current_device(device)) return ec;
  current_device_ = device;
  return {};
}

std::error_code device_scope::select_borrowed(int device) noexcept {
  if (device == borrowed_device_) return {};
  if (!borrowed_changed_) {
    borrowed_changed_ = true;
    borrowed_capture_mode_ = backend_.begin_borrowed_polling();
    int own = -1;
    if (backend_.current_device(own)) own = -1;
    borrowed_saved_device_ = borrowed_device_ = own;
    if (device == own) return {};
  }
  if (auto ec = backend_.set_current_device(device)) return ec;
  borrowed_device_ = device;
  return {};
}

void device_scope::end_borrowed() noexcept {
  if (borrowed_changed_) {
    if (borrowed_saved_device_ >= 0 && borrowed_device_ != borrowed_saved_device_)
      (void)backend_.set_current_device(borrowed_saved_device_);
    backend_.end_borrowed_polling(borrowed_capture_mode_);
  }
  borrowed_changed_ = false;
  borrowed_device_ = borrowed_saved_device_ = -1;
  borrowed_ = false;
}

}  // namespace evr::detail
