"""Vision-language models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): images in data rows, the processor, M-RoPE positions.

Images flow with their prompt: the dataset keeps each row's images (and, with `data.return_multi_modal_inputs`,
the processor's `pixel_values` / `image_grid_thw`), the engines get the images with the prompt, and the
`Batch` carries every row's patches, grids and 3-D positions to the training forward of every role.
"""
