# Writes a C source defining a file's bytes as an array (plus a NUL after them):
#   const unsigned char NAME[] = {...};  const size_t NAME_len = <bytes>;
# Run at build time: cmake -DIN=file -DOUT=file.c -DNAME=symbol -P embed.cmake
foreach(v IN ITEMS IN OUT NAME)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "embed.cmake: -D${v}= is required")
  endif()
endforeach()
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR n "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){16})" "\\1\n" bytes "${bytes}")
get_filename_component(src "${IN}" NAME)
file(WRITE "${OUT}.tmp" "/* generated from ${src} by cmake/embed.cmake: do not edit */\n"
  "#include <stddef.h>\n"
  "const unsigned char ${NAME}[] = {\n${bytes}0x00};\n"
  "const size_t ${NAME}_len = ${n};\n")
file(RENAME "${OUT}.tmp" "${OUT}")
