// EVR_SERVER_SANITIZED is 1 in a build under ASan or TSan (GCC's and Clang's spellings): their
// allocators serve malloc in place of glibc's, which the server's allocation counting and heap
// trimming are written for.
#pragma once

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define EVR_SERVER_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define EVR_SERVER_SANITIZED 1
#endif
#endif

#ifndef EVR_SERVER_SANITIZED
#define EVR_SERVER_SANITIZED 0
#endif
