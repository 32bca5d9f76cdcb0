# moex_gpus.cmake: the GPUs of the machine that runs the configure, for MOEX_CUDA=AUTO
# (CMakeLists.txt). Asks the driver, without enabling CUDA in CMake (which costs seconds even
# where there is no GPU):
#   1. __nvcc_device_query beside nvcc (CUDA 11.6 and newer: what `nvcc -arch=native` runs),
#      which prints the compute capability of every device, e.g. "90" or "80,90";
#   2. else nvidia-smi --query-gpu=compute_cap (a driver of 2022 or newer): "9.0" per line.
# No driver, or a driver without devices: no GPU.

# moex_detect_gpus(<nvcc> <caps var> <how var>): <caps var> is the list of the compute
# capabilities found, as CUDA architecture numbers (80, 90, 120 ...), each once; empty when
# there is no GPU. <how var> names the tool that answered (for the configure's message).
function(moex_detect_gpus nvcc caps_var how_var)
  set(caps "")
  set(how "")
  if(nvcc)
    get_filename_component(dir "${nvcc}" DIRECTORY)
    if(EXISTS "${dir}/__nvcc_device_query")
      execute_process(COMMAND "${dir}/__nvcc_device_query" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                      ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE TIMEOUT 60)
      if(rc EQUAL 0)
        string(REGEX MATCHALL "[0-9]+" caps "${out}")
        set(how "__nvcc_device_query")
      endif()
    endif()
  endif()
  if(NOT caps)
    find_program(MOEX_NVIDIA_SMI nvidia-smi)
    mark_as_advanced(MOEX_NVIDIA_SMI)
    if(MOEX_NVIDIA_SMI)
      execute_process(COMMAND "${MOEX_NVIDIA_SMI}" --query-gpu=compute_cap --format=csv,noheader
                      RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_QUIET TIMEOUT 60)
      if(rc EQUAL 0)
        string(REGEX MATCHALL "[0-9]+\\.[0-9]+" caps "${out}")
        list(TRANSFORM caps REPLACE "\\." "")
        set(how "nvidia-smi")
      endif()
    endif()
  endif()
  if(caps)
    list(REMOVE_DUPLICATES caps)
  endif()
  set(${caps_var} "${caps}" PARENT_SCOPE)
  set(${how_var} "${how}" PARENT_SCOPE)
endfunction()

# moex_cuda_archs_for(<caps> <archs var>): the CUDA_ARCHITECTURES entries moex builds for
# those compute capabilities: 9.0 as 90a (the Hopper kernels use its wgmma and TMA), the others
# as they are; below 8.0 none (the backend needs sm_80: mma.sync on bf16).
function(moex_cuda_archs_for caps archs_var)
  set(archs "")
  foreach(c IN LISTS caps)
    if(c LESS 80)
      continue()
    elseif(c EQUAL 90)
      list(APPEND archs 90a)
    else()
      list(APPEND archs ${c})
    endif()
  endforeach()
  set(${archs_var} "${archs}" PARENT_SCOPE)
endfunction()
