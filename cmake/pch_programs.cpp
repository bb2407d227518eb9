// The program that owns a precompiled header image (cmake/TpuPch.cmake): tpu_pch_tests for the
// test programs, tpu_pch_programs for the programs linking libtpucore; only its image is used.
int main() { return 0; }
